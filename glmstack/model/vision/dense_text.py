"""GLM-4.1V's text decoder: GLM-4-0414, dense (transformers `Glm4vTextModel` + the LM head).

Differs from GLM-4.5's block in three ways: sandwich norms (x + norm(attn(norm(x))), x + norm(mlp(norm(x))): four
RMSNorms a layer), one fused `gate_up_proj` for the SwiGLU, and RoPE on interleaved pairs (2i, 2i+1) of the first
partial_rotary_factor * head_dim dims. Same forward interface as `GLM` (input_ids or inputs_embeds, labels already
shifted, a `rope` (cos, sin) override for 3D RoPE, the KV-cache protocol of docs/CONTRACTS.md) and the same
`GLMOutput`, so `GLMV` drives either decoder alike.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from glmstack.model.attention import sdpa, segment_mask
from glmstack.model.gemm import Linear
from glmstack.model.layers import RMSNorm
from glmstack.model.loss import cross_entropy, linear_cross_entropy
from glmstack.model.model import GLMOutput
from glmstack.model.vision.mrope import mrope_cos_sin


def apply_interleaved_rope(x_BHTK, cos_BTR, sin_BTR):
    """Rotate pairs (2i, 2i+1) of the first R dims of x (B, H, T, Dh) (cos/sin repeat each frequency twice)."""
    r = cos_BTR.shape[-1]
    cos, sin = cos_BTR[:, None], sin_BTR[:, None]
    x_rot, x_pass = x_BHTK[..., :r], x_BHTK[..., r:]
    rotated = torch.stack((-x_rot[..., 1::2], x_rot[..., 0::2]), dim=-1).flatten(-2)
    return torch.cat((x_rot * cos + rotated * sin, x_pass), dim=-1)


class DenseAttention(nn.Module):
    def __init__(self, cfg, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        d = cfg.hidden_size
        self.q_proj = Linear(d, self.n_heads * self.head_dim, bias=True)
        self.k_proj = Linear(d, self.n_kv * self.head_dim, bias=True)
        self.v_proj = Linear(d, self.n_kv * self.head_dim, bias=True)
        self.o_proj = Linear(self.n_heads * self.head_dim, d, bias=False)

    def forward(self, x_BTD, cos, sin, mask=None, cache=None):
        B, T, _ = x_BTD.shape
        q_BHTK = apply_interleaved_rope(self.q_proj(x_BTD).view(B, T, self.n_heads, -1).transpose(1, 2), cos, sin)
        k_BGTK = apply_interleaved_rope(self.k_proj(x_BTD).view(B, T, self.n_kv, -1).transpose(1, 2), cos, sin)
        v_BGTK = self.v_proj(x_BTD).view(B, T, self.n_kv, -1).transpose(1, 2)
        if cache is not None:
            k_BGTK, v_BGTK = cache.update(self.layer_idx, k_BGTK, v_BGTK)
            cache_mask = cache.attention_mask(self.layer_idx, T)
            mask = cache_mask if cache_mask is not None else mask
        o_BHTK = sdpa(q_BHTK, k_BGTK, v_BGTK, mask)
        return self.o_proj(o_BHTK.transpose(1, 2).reshape(B, T, -1))


class FusedMLP(nn.Module):
    """SwiGLU with one gate_up_proj (D -> 2F: gate rows first, then up) as GLM-4 stores it."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate_up_proj = Linear(dim, 2 * hidden, bias=False)
        self.down_proj = Linear(hidden, dim, bias=False)

    def muon_blocks(self) -> dict[str, tuple]:
        """W_gate and W_up orthogonalised apart, as the MoE experts' banks and GLM-4.5's separate gate/up_proj."""
        f = self.down_proj.weight.shape[1]
        return {"gate_up_proj.weight": (1, (f, f))}

    def forward(self, x):
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DenseBlock(nn.Module):
    def __init__(self, cfg, layer_idx: int):
        super().__init__()
        d, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.input_layernorm = RMSNorm(d, eps)
        self.self_attn = DenseAttention(cfg, layer_idx)
        self.post_self_attn_layernorm = RMSNorm(d, eps)
        self.post_attention_layernorm = RMSNorm(d, eps)
        self.mlp = FusedMLP(d, cfg.intermediate_size)
        self.post_mlp_layernorm = RMSNorm(d, eps)

    def forward(self, x_BTD, cos, sin, mask=None, cache=None, valid_BT=None):
        x_BTD = x_BTD + self.post_self_attn_layernorm(self.self_attn(self.input_layernorm(x_BTD), cos, sin, mask,
                                                                      cache))
        x_BTD = x_BTD + self.post_mlp_layernorm(self.mlp(self.post_attention_layernorm(x_BTD)))
        return x_BTD, None, None


class DenseGLM4(nn.Module):
    """embed -> DenseBlocks -> RMSNorm -> LM head; built on meta (GLMV materialises it)."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        with torch.device("meta"):
            self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
            self.layers = nn.ModuleList(DenseBlock(cfg, i) for i in range(cfg.num_hidden_layers))
            self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
            self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.mtp = nn.ModuleList()  # no MTP layer (GLMV reads len(mtp))

    def embed(self, input_ids):
        return self.embed_tokens(input_ids)

    def forward(self, input_ids, labels=None, position_ids=None, segment_ids=None, cache=None, mtp_weight=None,
                aux_loss_weight=None, inputs_embeds=None, rope=None) -> GLMOutput:
        """As GLM.forward (no MTP, no MoE: aux_loss 0, expert_load None)."""
        B, T = input_ids.shape
        if position_ids is None:
            offset = cache.seq_len if cache is not None else 0
            position_ids = (torch.arange(T, device=input_ids.device) + offset).expand(B, T)
        mask = segment_mask(segment_ids) if segment_ids is not None else None
        x_BTD = self.embed(input_ids) if inputs_embeds is None else inputs_embeds
        if rope is None:  # 1D positions: all three rows equal
            rope = mrope_cos_sin(position_ids[None].expand(3, B, T), self.cfg.rotary_dim, self.cfg.rope_theta,
                                 [self.cfg.rotary_dim // 2, 0, 0], x_BTD.dtype, interleave=True)
        for layer in self.layers:
            x_BTD, _, _ = layer(x_BTD, *rope, mask, cache)
        h_BTD = self.norm(x_BTD)
        out = GLMOutput(hidden=h_BTD, _head=self.lm_head, _grad=torch.is_grad_enabled())
        out.aux_loss = x_BTD.new_zeros((), dtype=torch.float32)
        if labels is None or not self.cfg.fused_lm_loss:
            out._logits = self.lm_head(h_BTD)
        if labels is not None:
            out.lm_loss = self.lm_loss(h_BTD, labels, out._logits)
            out.loss = out.lm_loss
        return out

    def lm_loss(self, h_BTD, labels_BT, logits_BTV=None):
        if self.cfg.fused_lm_loss:
            return linear_cross_entropy(h_BTD, self.lm_head.weight, labels_BT)
        return cross_entropy(self.lm_head(h_BTD) if logits_BTV is None else logits_BTV, labels_BT)
