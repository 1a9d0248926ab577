"""RMSNorm and the SwiGLU MLP: the two building blocks every GLM layer shares.

Both compute exactly what transformers' `Glm4MoeRMSNorm` / `Glm4MoeMLP` compute (RMSNorm in fp32, cast back before
the gain), so HF checkpoints give the same numbers. On CPU in fp32, RMSNorm runs torch's fused `F.rms_norm` (one
kernel forward instead of five; bit-identical output, tests/unit/test_model_layers.py); other dtypes and devices
run the plain reference `rms_norm_reference`. Shapes: `(..., D)` in, `(..., D)` out.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from glmstack.model.gemm import Linear


class RMSNorm(nn.Module):
    """y = w * (x / sqrt(mean(x^2) + eps)), the statistic in fp32 (Zhang & Sennrich 2019)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "cpu" and x.dtype == self.weight.dtype == torch.float32:
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        return rms_norm_reference(x, self.weight, self.eps)


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' op sequence: the statistic in fp32, cast back to x's dtype before the gain."""
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)) (Shazeer 2020); the dense layers and the shared expert."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate_proj = Linear(dim, hidden, bias=False)
        self.up_proj = Linear(dim, hidden, bias=False)
        self.down_proj = Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
