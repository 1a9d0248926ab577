"""fp32 GEMMs on CPU through oneDNN: the model's linear layers and fused LM loss call these.

Why: torch sends fp32 CPU matmuls to MKL, which on AMD CPUs runs its AVX2 kernels even where the CPU has AVX-512.
oneDNN, also inside torch, runs AVX-512 kernels there: at the training shapes of `tiny-moe` it did ~240 GFLOP/s
per core against MKL's ~105-110 on a Zen 5 (`python bench/gemm.py`); on a Zen 4, whose AVX-512 is double-pumped,
the two are about even. oneDNN builds (and caches) a kernel per operand shape, ~0.8 ms a new shape: only
fixed-shape GEMMs belong here, so the MoE's per-expert blocks, whose row counts change every step, use torch.mm. Same maths in fp32; only the
summation order differs (results within ~1e-6 relative). On GPU, under autocast or compile, in other dtypes, for
small blocks (where oneDNN's per-call cost loses), or with GLMSTACK_ONEDNN=0, everything is plain torch: that
is the reference `tests/unit/test_gemm.py` compares with, forward and backward.

    y = linear(x, w, b)          # == F.linear(x, w, b), with autograd
    c = mm(a, b)                 # == a @ b          (a (M, K), b (K, N))
    c = mm_tn(a, b)              # == a.T @ b        (a (M, P), b (M, Q)): weight gradients
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from glmstack.model import invariant

ENABLED = os.environ.get("GLMSTACK_ONEDNN", "1") != "0"
MIN_ROWS = 32  # below this oneDNN's per-call setup costs more than its faster kernel saves (measured)


def _available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


AVAILABLE = _available()


def use_onednn(*tensors: torch.Tensor) -> bool:
    """oneDNN for these operands: CPU fp32, outside autocast and torch.compile (inductor has its own lowering for
    linear layers and cannot lower this op on unpacked weights), switched on."""
    return (
        ENABLED
        and AVAILABLE
        and not torch.compiler.is_compiling()
        and all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors)
        and not torch.is_autocast_enabled("cpu")
    )


def _lp(src: torch.Tensor, weight: torch.Tensor, bias=None) -> torch.Tensor:
    """src (M, K) @ weight (N, K).T + bias. src must be contiguous; weight may be any strided view (oneDNN
    reorders it into its blocked layout anyway)."""
    return torch.ops.mkldnn._linear_pointwise(src, weight, bias, "none", [], "")


def mm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """a (M, K) @ b (K, N) -> (M, N), into `out` if given."""
    if a.shape[0] < MIN_ROWS or not use_onednn(a, b):
        return torch.mm(a, b, out=out) if out is not None else a @ b
    c = _lp(a.contiguous(), b.t())
    return out.copy_(c) if out is not None else c


def mm_tn(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """a (M, P).T @ b (M, Q) -> (P, Q), into `out` if given. One operand is transposed into a contiguous copy:
    the smaller one; the other goes in as oneDNN's weight, which it reorders whatever its strides."""
    if a.shape[0] < MIN_ROWS or not use_onednn(a, b):
        return torch.mm(a.t(), b, out=out) if out is not None else a.t() @ b
    if a.numel() <= b.numel():
        c = _lp(a.t().contiguous(), b.t())  # (P, Q)
    else:
        c = _lp(b.t().contiguous(), a.t()).t()  # (Q, P).T
    return out.copy_(c) if out is not None else c.contiguous()


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, w, b) with forward and backward GEMMs through oneDNN where `use_onednn` says so (inside
    invariant.batch_invariant(): the row-invariant GEMM instead)."""
    if invariant.enabled():
        return invariant.linear(x, w, b)
    if not use_onednn(x, w) or x.numel() < MIN_ROWS * x.shape[-1]:
        return F.linear(x, w, b)
    return _Linear.apply(x, w, b)


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b):
        x_MK = x.reshape(-1, x.shape[-1]).contiguous()
        ctx.save_for_backward(x_MK, w)
        ctx.x_shape, ctx.has_bias = x.shape, b is not None
        return _lp(x_MK, w, b).view(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, dy):
        x_MK, w = ctx.saved_tensors
        dy_MN = dy.reshape(-1, dy.shape[-1]).contiguous()
        dx = mm(dy_MN, w).view(ctx.x_shape) if ctx.needs_input_grad[0] else None
        dw = mm_tn(dy_MN, x_MK) if ctx.needs_input_grad[1] else None
        db = dy_MN.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return dx, dw, db


class Linear(torch.nn.Linear):
    """nn.Linear (same parameters, same state-dict names) whose forward is `linear`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)
