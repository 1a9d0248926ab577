"""Rotary position embedding (Su et al. 2021), partial and half-split, as GLM-4.5 uses it.

GLM-4.5 rotates only the first `rotary_dim = partial_rotary_factor * head_dim` dims of each head (64 of 128) with the
NeoX "rotate_half" convention; the rest pass through (transformers `glm4_moe` `apply_rotary_pos_emb`).
The frequencies are recomputed per forward from `(rotary_dim, theta)`: no buffer, so a meta-built model needs no
extra initialisation and a base change for long context is just a config change.
"""

from __future__ import annotations

import torch


def rope_cos_sin(position_ids: torch.Tensor, rotary_dim: int, theta: float, dtype: torch.dtype):
    """cos, sin of shape (B, T, rotary_dim) for integer positions (B, T); angles computed in fp32."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, device=position_ids.device).float() / rotary_dim))
    freqs = position_ids[..., None].float() * inv_freq  # (B, T, rotary_dim/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (B, T, rotary_dim)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_partial_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first cos.shape[-1] dims of x (B, H, T, Dh) by (B, T, R) cos/sin; keep the rest."""
    r = cos.shape[-1]
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # (B, 1, T, R)
    x_rot, x_pass = x[..., :r], x[..., r:]
    return torch.cat((x_rot * cos + rotate_half(x_rot) * sin, x_pass), dim=-1)
