"""Multi-token prediction (DeepSeek-V3 §2.2; GLM-4.5 §2.1 keeps one MoE MTP layer for speculative decoding).

Depth d (1-based) at position t combines the previous depth's hidden state h^{d-1}_t with the embedding of
token t+d: h' = eh_proj([enorm(emb(x_{t+d})) ; hnorm(h^{d-1}_t)]) (embedding first, as in the checkpoints,
vLLM, Megatron and transformers `MtpLayer`), then one MoE decoder block and `shared_head.norm`; the shared LM head
gives the logits for x_{t+d+1}. The normed output feeds the next depth, as transformers `MtpModel` chains it.
The embedding and LM head are the main model's (the only implicit tie, see hf.py).

`mtp_targets` builds the shifted inputs/labels of one depth; labels that would cross a packed-document boundary
are ignored.
"""

from __future__ import annotations

import torch
from torch import nn

from glmstack.model.gemm import Linear
from glmstack.model.layers import RMSNorm


class MTPLayer(nn.Module):
    def __init__(self, cfg, block: nn.Module):
        super().__init__()
        d = cfg.hidden_size
        self.enorm = RMSNorm(d, cfg.rms_norm_eps)
        self.hnorm = RMSNorm(d, cfg.rms_norm_eps)
        self.eh_proj = Linear(2 * d, d, bias=False)
        self.block = block  # a full MoE decoder block (HF: the rest of model.layers.{num_hidden_layers + d})
        self.final_norm = RMSNorm(d, cfg.rms_norm_eps)  # HF: shared_head.norm

    def forward(self, emb_BTD, h_BTD, cos, sin, mask=None, cache=None, valid_BT=None):
        """-> (normed hidden (B, T, D) for the LM head and the next depth, aux loss, expert load)."""
        x_BTD = self.eh_proj(torch.cat([self.enorm(emb_BTD), self.hnorm(h_BTD)], dim=-1))
        x_BTD, aux, load_E, _ = self.block(x_BTD, cos, sin, mask, cache, valid_BT)
        return self.final_norm(x_BTD), aux, load_E


def mtp_targets(input_ids_BT, labels_BT, depth: int, segment_ids_BT=None):
    """Inputs x_{t+d} (pad 0) and targets labels_{t+d} (pad -100) for depth d, same (B, T) shapes."""
    B = input_ids_BT.shape[0]
    pad_ids = input_ids_BT.new_zeros(B, depth)
    ids = torch.cat([input_ids_BT[:, depth:], pad_ids], dim=1)
    labels = torch.cat([labels_BT[:, depth:], labels_BT.new_full((B, depth), -100)], dim=1)
    if segment_ids_BT is not None:
        shifted = torch.cat([segment_ids_BT[:, depth:], segment_ids_BT[:, -1:].expand(B, depth)], dim=1)
        labels = labels.masked_fill(shifted != segment_ids_BT, -100)
    return ids, labels
