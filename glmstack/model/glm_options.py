"""The GLM family's other training options, each behind a ModelConfig flag (off = GLM-4.5, unchanged).

GLM (Du et al. 2021, arXiv 2103.10360) -- autoregressive blank infilling (data side: glmstack/data/blank_infilling.py):
- 2D positions (`position_2d`): position_ids is (B, 2, T): row 0 = position in the corrupted text (a span's tokens
  all carry the position of their [MASK]), row 1 = position inside the span (0 in Part A, 1.. in Part B). The
  paper adds two learned position embeddings; on GLM-4.5's RoPE we use the 2D rotary split of ChatGLM: the rotary
  dims' frequency pairs are halved, one half rotated by row 0, the other by row 1 (`rope_cos_sin_2d`).
- Part A / Part B attention (`prefix_lm_mask`): every token sees all of Part A (the corrupted text, bidirectional);
  Part B (the spans) is causal. The batch carries `prefix_len` (B,) = |Part A|.

GLM-130B (Zeng et al. 2022, arXiv 2210.02414, §2.3 and §3) -- training stabilisers:
- DeepNorm (`deepnorm`): Post-LN blocks  x <- LN(alpha * x + f(x))  with alpha = (2N)^(1/2), and the value/output
  projections and the MLP (dense, shared and routed experts) initialised with std * beta, beta = (8N)^(-1/2),
  N = num_hidden_layers (GLM-130B's values; DeepNet, arXiv 2203.00555, uses ^(1/4) for decoder-only models).
- Embedding-gradient shrink (`embedding_grad_shrink` = a):  emb <- a * emb + (1 - a) * emb.detach(): the forward
  value is unchanged, the embedding's gradient is exactly a times the unshrunk one (GLM-130B: a = 0.1).
"""

from __future__ import annotations

import torch

from glmstack.model.attention import causal_mask

# parameter-name parts DeepNorm's beta scales at init (DeepNet: v_proj, out_proj and the FFN; q/k keep std)
DEEPNORM_SCALED = (".self_attn.v_proj.", ".self_attn.o_proj.", ".mlp.experts.", ".mlp.shared_experts.",
                   ".mlp.gate_proj.", ".mlp.up_proj.", ".mlp.down_proj.")


def deepnorm_alpha(n_layers: int) -> float:
    """Residual scale alpha = (2N)^(1/2) (GLM-130B)."""
    return (2.0 * n_layers) ** 0.5


def deepnorm_beta(n_layers: int) -> float:
    """Init scale beta = (8N)^(-1/2) (GLM-130B) on DEEPNORM_SCALED weights."""
    return (8.0 * n_layers) ** -0.5


def init_scale(cfg, name: str) -> float:
    """Multiplier on the normal init's std of parameter `name` (1 unless DeepNorm scales it)."""
    if cfg.deepnorm and name.endswith(("weight", "gate_up_proj", "down_proj")) and any(s in name for s in DEEPNORM_SCALED):
        return deepnorm_beta(cfg.num_hidden_layers)
    return 1.0


def shrink_embedding_grad(x: torch.Tensor, a: float) -> torch.Tensor:
    """a * x + (1 - a) * x.detach(), written x.detach() + a * (x - x.detach()): algebraically the same, but the
    value is x bit for bit (x - x.detach() is exactly 0), so only the gradient changes: exactly a times the
    incoming one. Identity when a == 1."""
    if a == 1.0:
        return x
    x0 = x.detach()
    return x0 + a * (x - x0)


def rope_cos_sin_2d(position_ids_B2T: torch.Tensor, rotary_dim: int, theta: float, dtype: torch.dtype):
    """cos, sin (B, T, rotary_dim) for 2D positions, laid out for rotate-half `apply_partial_rope`.

    Rotate-half pairs dim i with i + R/2 at frequency slot i. Slots [0, R/4) get the frequencies of a rotary
    of width R/2 applied to row 0 (text position), slots [R/4, R/2) the same frequencies applied to row 1 (span
    position): two independent RoPEs of width R/2 each, as ChatGLM's 2D rotary."""
    half = rotary_dim // 2
    inv_freq = 1.0 / (theta ** (torch.arange(0, half, 2, device=position_ids_B2T.device).float() / half))  # (R/4,)
    f0 = position_ids_B2T[:, 0, :, None].float() * inv_freq  # (B, T, R/4)
    f1 = position_ids_B2T[:, 1, :, None].float() * inv_freq
    freqs = torch.cat((f0, f1), dim=-1)  # (B, T, R/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (B, T, R)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def prefix_lm_mask(prefix_len_B: torch.Tensor, T: int, segment_ids_BT: torch.Tensor | None = None) -> torch.Tensor:
    """(B, 1, T, T) bool, True = attend: key j is visible to query i when j < prefix_len (Part A, bidirectional)
    or j <= i (Part B, causal); with segment_ids, never across segments (segment 0 = padding sees only padding)."""
    keys = torch.arange(T, device=prefix_len_B.device)
    in_a_BS = keys[None, :] < prefix_len_B[:, None]  # (B, T)
    mask_BTS = causal_mask(T, T, prefix_len_B.device)[0] | in_a_BS[:, None, :]  # (B, T, T)
    if segment_ids_BT is not None:
        mask_BTS = mask_BTS & (segment_ids_BT[:, :, None] == segment_ids_BT[:, None, :])
    return mask_BTS[:, None]
