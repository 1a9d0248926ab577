"""Rotary position embedding (Su et al. 2021), partial and half-split, as GLM-4.5 uses it.

GLM-4.5 rotates only the first `rotary_dim = partial_rotary_factor * head_dim` dims of each head (64 of 128) with the
NeoX "rotate_half" convention; the rest pass through (transformers `glm4_moe` `apply_rotary_pos_emb`).
The frequencies are recomputed per forward from `(rotary_dim, theta)`: no buffer, so a meta-built model needs no
extra initialisation and a base change for long context is just a config change.

`RopeTable` is the same rotation for decoding (inference/fast.py): the angles of `rope_cos_sin` tabulated once per
generate call over full head width (cos 1, sin 0 on the pass-through dims) and rotate_half as a product with a
signed permutation matrix, x cos + (x R) sin: bit for bit `apply_partial_rope` (R's entries are 0 and ±1, so
every product and sum is exact; tests/unit/test_model_rope.py), in 4 whole-tensor ops instead of ~9 (27 against
46 µs a layer at one token on CPU). Training keeps the slicing form, which needs no table.

`apply_rope` is GLM-5's rotation (MLA and the DSA indexer: interleaved pairs over the whole rope slice).
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


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleave: bool = True) -> torch.Tensor:
    """Rotate the last dim of x (..., R) by cos/sin broadcastable to (..., R/2) (one angle per pair).

    interleave=True rotates pairs (x0,x1),(x2,x3),... and writes [evens | odds] (GLM-5 / HF layout);
    interleave=False is NeoX half-split (pairs (x_i, x_{i+R/2})).
    """
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    if interleave:
        x1, x2 = x[..., 0::2], x[..., 1::2]
    else:
        x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class RopeTable:
    """apply_partial_rope for positions below max_len, in the (B, T, heads, Dh) layout of a decode step."""

    def __init__(self, max_len: int, head_dim: int, rotary_dim: int, theta: float, dtype, device):
        cos, sin = rope_cos_sin(torch.arange(max_len, device=device)[None], rotary_dim, theta, dtype)  # (1, S, R)
        R = rotary_dim
        self.cos_SK = torch.ones(max_len, head_dim, dtype=dtype, device=device)
        self.sin_SK = torch.zeros(max_len, head_dim, dtype=dtype, device=device)
        self.cos_SK[:, :R], self.sin_SK[:, :R] = cos[0], sin[0]
        self.rot_KK = torch.zeros(head_dim, head_dim, dtype=dtype, device=device)  # x @ rot == rotate_half on :R
        half = torch.arange(R // 2, device=device)
        self.rot_KK[half + R // 2, half] = -1.0  # out[:R/2] = -x[R/2:R]
        self.rot_KK[half, half + R // 2] = 1.0  # out[R/2:R] = x[:R/2]

    def at(self, position_ids_BT: torch.Tensor):
        """-> (cos, sin) (B, T, 1, Dh) for `rotate`: one gather per generate step, shared by every layer."""
        return self.cos_SK[position_ids_BT][:, :, None], self.sin_SK[position_ids_BT][:, :, None]

    def rotate(self, x_BTHK: torch.Tensor, cos_BT1K: torch.Tensor, sin_BT1K: torch.Tensor) -> torch.Tensor:
        return x_BTHK * cos_BT1K + torch.matmul(x_BTHK, self.rot_KK) * sin_BT1K
