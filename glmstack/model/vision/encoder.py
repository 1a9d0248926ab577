"""The ViT of GLM-4.1V / GLM-4.5V and its patch merger (the MLP adapter), arXiv 2507.01006 §2.

pixel_values -> 3D-conv patch embedding (an image is a two-frame clip: temporal_patch_size frames per patch) ->
RMSNorm -> + learned position embeddings bicubically interpolated to the image's own patch grid -> `depth` pre-norm
blocks whose attention uses 2D RoPE (half the head dims turn with the patch row, half with the column) and never
crosses images -> RMSNorm -> stride-m conv merging m x m patches into one token of the decoder's width -> merger
(Linear, LayerNorm, GELU, SwiGLU). Computes what transformers' `Glm4vVisionModel` computes (tests/parity/
test_vl_hf.py); the names are its state-dict names under `visual.`.

Input layout: `pixel_values` (N_patches, C * temporal_patch_size * P * P) and `grid_thw` (N_images, 3) exactly as
`Glm4vImageProcessor` returns them: each image's patches in raster order of m x m blocks (the m^2 patches of one
merged token are consecutive). Output: (N_patches / m^2, out_hidden_size), the images' tokens concatenated.
The two convolutions have kernel = stride = their input, so they run as one matmul each (same weights, same names).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from glmstack.model.gemm import Linear
from glmstack.model.layers import MLP, RMSNorm
from glmstack.model.rope import rotate_half
from glmstack.model.vision.mrope import VisionInputError


class PatchEmbed(nn.Module):
    """Conv3d(C, D, kernel = stride = (temporal_patch_size, P, P)) on one patch per row, as a matmul."""

    def __init__(self, vc):
        super().__init__()
        self.proj = nn.Conv3d(vc.in_channels, vc.hidden_size, kernel_size=(vc.temporal_patch_size, vc.patch_size,
                                                                             vc.patch_size),
                              stride=(vc.temporal_patch_size, vc.patch_size, vc.patch_size))

    def forward(self, pixels_NP: torch.Tensor) -> torch.Tensor:
        w = self.proj.weight
        return F.linear(pixels_NP.to(w.dtype), w.reshape(w.shape[0], -1), self.proj.bias)  # (N, D)


class PositionEmbedding(nn.Module):
    """A learned (S x S) table, S = image_size / patch_size, resampled bicubically (fp32) at each patch's centre in
    its own image's grid: any resolution and aspect ratio reads the same table."""

    def __init__(self, vc):
        super().__init__()
        self.side = vc.image_size // vc.patch_size
        self.position_embedding = nn.Embedding(self.side**2, vc.hidden_size)

    def forward(self, x_ND, hw_N2, size_N2) -> torch.Tensor:
        table = self.position_embedding.weight
        table_1DSS = table.view(self.side, self.side, -1).permute(2, 0, 1)[None].float()
        centre_N2 = (hw_N2.float() + 0.5) / size_N2.float() * 2 - 1  # (h, w) in [-1, 1]
        grid_1N12 = centre_N2.flip(-1)[None, :, None, :]  # grid_sample reads (x=w, y=h)
        pos_1DN1 = F.grid_sample(table_1DSS, grid_1N12, mode="bicubic", align_corners=False, padding_mode="border")
        return x_ND + pos_1DN1[0, :, :, 0].T.to(table.dtype)


class VisionAttention(nn.Module):
    def __init__(self, vc):
        super().__init__()
        self.n_heads, self.head_dim = vc.num_heads, vc.head_dim
        self.qkv = Linear(vc.hidden_size, 3 * vc.hidden_size, bias=vc.attention_bias)
        self.proj = Linear(vc.hidden_size, vc.hidden_size, bias=False)

    def muon_blocks(self) -> dict[str, tuple]:
        """Muon orthogonalises W_q, W_k and W_v of the fused qkv apart (rows [q; k; v]), as the text model's."""
        d = self.n_heads * self.head_dim
        return {"attn.qkv.weight": (1, (d, d, d))}

    def forward(self, x_ND, cos_NK, sin_NK, lengths: list[int]):
        N = x_ND.shape[0]
        q_NHK, k_NHK, v_NHK = self.qkv(x_ND).view(N, 3, self.n_heads, self.head_dim).unbind(1)
        q_NHK, k_NHK = rope_2d(q_NHK, cos_NK, sin_NK), rope_2d(k_NHK, cos_NK, sin_NK)
        outs = [F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1))
                for q, k, v in zip(q_NHK.split(lengths), k_NHK.split(lengths), v_NHK.split(lengths))]
        o_NHK = torch.cat([o.transpose(0, 1) for o in outs])  # each image attends only to itself
        return self.proj(o_NHK.reshape(N, -1))


def rope_2d(x_NHK, cos_NK, sin_NK):
    """Rotate-half RoPE over the whole head, in fp32 (as HF's apply_rotary_pos_emb_vision)."""
    dtype = x_NHK.dtype
    x = x_NHK.float()
    cos, sin = cos_NK[:, None].float(), sin_NK[:, None].float()
    return (x * cos + rotate_half(x) * sin).to(dtype)


class VisionBlock(nn.Module):
    def __init__(self, vc):
        super().__init__()
        self.norm1 = RMSNorm(vc.hidden_size, vc.rms_norm_eps)
        self.attn = VisionAttention(vc)
        self.norm2 = RMSNorm(vc.hidden_size, vc.rms_norm_eps)
        self.mlp = MLP(vc.hidden_size, vc.out_hidden_size)

    def forward(self, x_ND, cos, sin, lengths):
        x_ND = x_ND + self.attn(self.norm1(x_ND), cos, sin, lengths)
        return x_ND + self.mlp(self.norm2(x_ND))


class PatchMerger(nn.Module):
    """The adapter: Linear -> LayerNorm -> GELU -> SwiGLU, at the decoder's width."""

    def __init__(self, vc):
        super().__init__()
        d = vc.out_hidden_size
        self.proj = Linear(d, d, bias=False)
        self.post_projection_norm = nn.LayerNorm(d, eps=1e-5)
        self.gate_proj = Linear(d, vc.intermediate_size, bias=False)
        self.up_proj = Linear(d, vc.intermediate_size, bias=False)
        self.down_proj = Linear(vc.intermediate_size, d, bias=False)

    def forward(self, x_MD):
        x_MD = F.gelu(self.post_projection_norm(self.proj(x_MD)))
        return self.down_proj(F.silu(self.gate_proj(x_MD)) * self.up_proj(x_MD))


class VisionEncoder(nn.Module):
    """(pixel_values, grid_thw) -> (N_tokens, out_hidden_size) decoder-width image tokens."""

    def __init__(self, vc):
        super().__init__()
        self.vc = vc
        self.patch_embed = PatchEmbed(vc)
        self.post_conv_layernorm = RMSNorm(vc.hidden_size, vc.rms_norm_eps)
        self.embeddings = PositionEmbedding(vc)
        self.blocks = nn.ModuleList(VisionBlock(vc) for _ in range(vc.depth))
        self.post_layernorm = RMSNorm(vc.hidden_size, vc.rms_norm_eps)
        m = vc.spatial_merge_size
        self.downsample = nn.Conv2d(vc.hidden_size, vc.out_hidden_size, kernel_size=m, stride=m)
        self.merger = PatchMerger(vc)

    def forward(self, pixel_values_NP: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        vc, m = self.vc, self.vc.spatial_merge_size
        check_pixels(pixel_values_NP, grid_thw, vc)
        hw_N2, size_N2, lengths = patch_coordinates(grid_thw, m)
        hw_N2, size_N2 = hw_N2.to(pixel_values_NP.device), size_N2.to(pixel_values_NP.device)
        x_ND = self.post_conv_layernorm(self.patch_embed(pixel_values_NP))
        cos, sin = vision_rope(hw_N2, vc.head_dim, vc.rope_theta)
        x_ND = self.embeddings(x_ND, hw_N2, size_N2)
        for block in self.blocks:
            x_ND = block(x_ND, cos, sin, lengths)
        x_ND = self.post_layernorm(x_ND)
        w = self.downsample.weight  # (out, D, m, m): one merged token from its m x m consecutive patches
        x_MX = x_ND.view(-1, m, m, x_ND.shape[-1]).permute(0, 3, 1, 2).reshape(-1, w[0].numel())
        return self.merger(F.linear(x_MX, w.reshape(w.shape[0], -1), self.downsample.bias))


def check_pixels(pixels_NP: torch.Tensor, grid_thw: torch.Tensor, vc) -> None:
    """pixel_values must be (sum t*h*w, patch_dim) with h, w multiples of spatial_merge_size (one clear error)."""
    m, rows = vc.spatial_merge_size, grid_thw.tolist() if grid_thw.dim() == 2 else None
    if rows is None or any(len(r) != 3 or r[1] % m or r[2] % m or min(r) <= 0 for r in rows):
        raise VisionInputError(f"grid_thw must be (N, 3) rows (t, h, w) with h, w multiples of spatial_merge_size "
                               f"{m}; got {grid_thw.tolist()}")
    want = (sum(t * h * w for t, h, w in rows), vc.patch_dim)
    if tuple(pixels_NP.shape) != want:
        raise VisionInputError(f"pixel values of shape {list(pixels_NP.shape)}, but grid_thw {rows} and patch_size "
                               f"{vc.patch_size} (temporal {vc.temporal_patch_size}) need {list(want)}")


def patch_coordinates(grid_thw: torch.Tensor, m: int):
    """-> (hw (N, 2) row/column of each patch in its image, size (N, 2) its image's (h, w) grid, patches per image)
    in the processor's block-major order (m x m blocks in raster order, raster inside a block), frames repeated."""
    hw, size, lengths = [], [], []
    for t, h, w in grid_thw.tolist():
        rows = torch.arange(h)[:, None].expand(h, w).reshape(h // m, m, w // m, m).transpose(1, 2).flatten()
        cols = torch.arange(w)[None, :].expand(h, w).reshape(h // m, m, w // m, m).transpose(1, 2).flatten()
        hw.append(torch.stack([rows, cols], dim=-1).repeat(t, 1))
        size.append(torch.tensor([h, w]).expand(t * h * w, 2))
        lengths.append(t * h * w)
    return torch.cat(hw), torch.cat(size), lengths


def vision_rope(hw_N2: torch.Tensor, head_dim: int, theta: float):
    """cos, sin (N, head_dim) fp32: frequencies of a head_dim/2-wide RoPE; the first half of the rotate-half slots
    turn with the row, the second with the column."""
    half = head_dim // 2
    inv_freq = 1.0 / (theta ** (torch.arange(0, half, 2, device=hw_N2.device).float() / half))  # (head_dim/4,)
    f_N2F = hw_N2[..., None].float() * inv_freq
    f_NK2 = torch.cat([f_N2F[:, 0], f_N2F[:, 1]], dim=-1)  # (N, head_dim/2): h freqs then w freqs
    emb = torch.cat([f_NK2, f_NK2], dim=-1)
    return emb.cos(), emb.sin()
