"""RMSNorm and the SwiGLU MLP: the two building blocks every GLM layer shares.

Both compute exactly what transformers' `Glm4MoeRMSNorm` / `Glm4MoeMLP` compute (RMSNorm in fp32, cast back before
the gain), so HF checkpoints give the same numbers. Shapes: `(..., D)` in, `(..., D)` out.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from glmstack.model import invariant
from glmstack.model.gemm import Linear


class RMSNorm(nn.Module):
    """y = w * (x / sqrt(mean(x^2) + eps)), the statistic in fp32 (Zhang & Sennrich 2019)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)) (Shazeer 2020); the dense layers and the shared expert."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate_proj = Linear(dim, hidden, bias=False)
        self.up_proj = Linear(dim, hidden, bias=False)
        self.down_proj = Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        act = invariant.silu if invariant.enabled() else F.silu
        return self.down_proj(act(self.gate_proj(x)) * self.up_proj(x))
