"""GLM-4.5 attention: GQA with q/k/v bias, optional per-head QK-Norm, partial RoPE, and the KV-cache interface.

Matches transformers `Glm4MoeAttention`: q/k/v projections (bias when `attention_bias`), QK RMSNorm over head_dim
before RoPE (`use_qk_norm`; GLM-4.5 §2.1 "to stabilise the range of attention logits"), rotate-half RoPE on the
first rotary_dim dims, softmax scale 1/sqrt(head_dim), o_proj without bias. The kernel is
`F.scaled_dot_product_attention` (flash / memory-efficient on GPU when the mask is plain causal).

Mask convention (docs/CONTRACTS.md): `mask` is None for causal attention or a bool (B, 1, T, T_all) tensor,
True = attend. A cache, when given, stores keys/values through `cache.update(layer_idx, k, v)` and may supply the
mask through `cache.attention_mask(layer_idx, T)`. `SimpleKVCache` is the reference cache used by tests.

Shape legend: B batch, T new tokens, S all keys (cache + new), D hidden, H query heads, G kv heads, Dh head dim.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from glmstack.model import invariant
from glmstack.model.gemm import Linear
from glmstack.model.layers import RMSNorm
from glmstack.model.rope import apply_partial_rope


class Attention(nn.Module):
    def __init__(self, cfg, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx  # index into the KV cache (MTP layers continue after the trunk)
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        d, bias = cfg.hidden_size, cfg.attention_bias
        self.q_proj = Linear(d, self.n_heads * self.head_dim, bias=bias)
        self.k_proj = Linear(d, self.n_kv * self.head_dim, bias=bias)
        self.v_proj = Linear(d, self.n_kv * self.head_dim, bias=bias)
        self.o_proj = Linear(self.n_heads * self.head_dim, d, bias=False)
        if cfg.use_qk_norm:
            self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def forward(self, x_BTD, cos, sin, mask=None, cache=None):
        B, T, _ = x_BTD.shape
        q_BTHK = self.q_proj(x_BTD).view(B, T, self.n_heads, self.head_dim)
        k_BTGK = self.k_proj(x_BTD).view(B, T, self.n_kv, self.head_dim)
        v_BGTK = self.v_proj(x_BTD).view(B, T, self.n_kv, self.head_dim).transpose(1, 2)
        if self.q_norm is not None:
            q_BTHK, k_BTGK = self.q_norm(q_BTHK), self.k_norm(k_BTGK)
        q_BHTK = apply_partial_rope(q_BTHK.transpose(1, 2), cos, sin)
        k_BGTK = apply_partial_rope(k_BTGK.transpose(1, 2), cos, sin)
        if cache is not None:
            k_BGTK, v_BGTK = cache.update(self.layer_idx, k_BGTK, v_BGTK)
            cache_mask = cache.attention_mask(self.layer_idx, T)
            mask = cache_mask if cache_mask is not None else mask
        o_BHTK = sdpa(q_BHTK, k_BGTK, v_BGTK, mask)
        return self.o_proj(o_BHTK.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))


def sdpa(q_BHTK, k_BGSK, v_BGSK, mask=None):
    """Causal (bottom-right aligned when S > T) or masked attention with GQA head sharing."""
    if invariant.enabled():
        return invariant.attention(q_BHTK, k_BGSK, v_BGSK, mask)
    T, S = q_BHTK.shape[2], k_BGSK.shape[2]
    if T == 1 and q_BHTK.device.type == "cpu":
        return attend_one(q_BHTK[:, :, 0], k_BGSK, v_BGSK, mask)[:, :, None]
    if mask is None and T not in (1, S):
        mask = causal_mask(T, S, q_BHTK.device)
    causal = mask is None and T > 1
    return F.scaled_dot_product_attention(q_BHTK, k_BGSK, v_BGSK, attn_mask=mask, is_causal=causal,
                                          enable_gqa=k_BGSK.shape[1] != q_BHTK.shape[1])


def attend_one(q_BHK, k_BGSK, v_BGSK, mask=None):
    """One query per row (a decode step): softmax(q k^T / sqrt(Dh)) v as two batched matmuls over the G kv groups,
    each with its H / G query heads as rows (GQA without repeating K/V). On CPU F.scaled_dot_product_attention's
    kernel costs ~1.6x this at decode sizes (docs/inference.md); the sums differ only in rounding
    (tests/unit/test_model_rope.py). mask: None or bool (B, 1, 1, S), True = attend. -> (B, H, Dh)."""
    B, H, Dh = q_BHK.shape
    G = k_BGSK.shape[1]
    q_BGhK = q_BHK.reshape(B, G, H // G, Dh) * Dh**-0.5
    s_BGhS = torch.matmul(q_BGhK, k_BGSK.transpose(-1, -2))
    if mask is not None:  # the same keys for every head
        s_BGhS = s_BGhS.masked_fill(mask.logical_not(), float("-inf"))
    return torch.matmul(s_BGhS.softmax(-1), v_BGSK).view(B, H, Dh)


def causal_mask(T: int, S: int, device) -> torch.Tensor:
    """(1, 1, T, S) bool: query i (the last T of S positions) sees keys j <= S - T + i."""
    i = torch.arange(T, device=device)[:, None] + (S - T)
    return (torch.arange(S, device=device)[None, :] <= i)[None, None]


def segment_mask(segment_ids_BT: torch.Tensor) -> torch.Tensor:
    """(B, 1, T, T) bool block-diagonal causal mask: attention never crosses packed documents."""
    T = segment_ids_BT.shape[1]
    same = segment_ids_BT[:, :, None] == segment_ids_BT[:, None, :]  # (B, T, T)
    return (same & causal_mask(T, T, segment_ids_BT.device)[0])[:, None]


class SimpleKVCache:
    """Reference KV cache: per-layer concatenation, plain causal masks. Same protocol as inference/kv_cache.py."""

    def __init__(self):
        self.k: dict[int, torch.Tensor] = {}
        self.v: dict[int, torch.Tensor] = {}

    @property
    def seq_len(self) -> int:
        """Positions already stored (read by the model before a forward, so layer 0's length)."""
        return self.k[0].shape[2] if 0 in self.k else 0

    def update(self, layer_idx: int, k_BGTK: torch.Tensor, v_BGTK: torch.Tensor):
        if layer_idx in self.k:
            k_BGTK = torch.cat([self.k[layer_idx], k_BGTK], dim=2)
            v_BGTK = torch.cat([self.v[layer_idx], v_BGTK], dim=2)
        self.k[layer_idx], self.v[layer_idx] = k_BGTK, v_BGTK
        return k_BGTK, v_BGTK

    def attention_mask(self, layer_idx: int, t_new: int):
        return None  # causal, aligned to the end of the stored keys
