"""Muon for hidden matrices and 3-D expert banks, with the GLM-4.5 settings.

Muon (Jordan et al. 2024; Moonlight, arXiv 2502.16982) replaces the Adam update of a weight matrix by the
orthogonalised momentum: U S Vᵀ -> ~U Vᵀ via 5 quintic Newton–Schulz steps. GLM-4.5 (arXiv 2508.06471 §2.4) uses
N = 5, μ = 0.95 (Nesterov), decoupled weight decay 0.1 and scales the update to AdamW's RMS with
0.2·sqrt(max(A, B)) ("match_rms_adamw"), so Muon reuses AdamW's learning rate.

Why our own class rather than `torch.optim.Muon`: torch's rejects 3-D parameters, and expert banks (E, out, in)
must be orthogonalised per expert as a batch; GLM-5's Muon Split orthogonalises each head's slice of a matrix
(the `split` option of a parameter group); and FSDP2 shards parameters, so the NS step must see the full
matrix: one owner rank per matrix gathers it, runs NS and scatters the rows back (muon_sharded.py), while banks
sharded over whole experts run NS where they are. On plain 2-D parameters this class runs the exact op sequence of torch 2.13's Muon and
`tests/unit/test_optim_muon.py` checks they agree bit for bit.

Shapes: A, B = rows, cols of one matrix (for nn.Linear: out, in); a bank is (E, A, B); a split matrix
(H·A_h, B) is orthogonalised as (H, A_h, B).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.optim import Optimizer

from glmstack.optim.muon_sharded import is_sharded, local_ok, orthogonalize_sharded

# Keller Jordan's quintic coefficients (also torch.optim.Muon's defaults): maximise the slope at 0.
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
EPS = 1e-7


def zeropower_via_newtonschulz(
    G: Tensor, steps: int = 5, coefficients=NS_COEFFICIENTS, eps: float = EPS, dtype=torch.bfloat16
) -> Tensor:
    """~U Vᵀ of G (..., A, B) by Newton–Schulz; singular values land roughly in (0.5, 1.5), not exactly 1.

    The 2-D branch is torch.optim.Muon's op sequence (addmm in bf16) so the two agree bit for bit; batches use
    the same maths with baddbmm and a per-matrix Frobenius norm.
    """
    a, b, c = coefficients
    X = G.to(dtype)
    tall = G.size(-2) > G.size(-1)
    if tall:  # iterate on the wide side so X Xᵀ is the smaller Gram matrix
        X = X.mT
    if X.ndim == 2:
        X = X.div(X.norm().clamp(min=eps))  # spectral norm <= Frobenius norm <= 1
        for _ in range(steps):
            gram = X @ X.T
            update = torch.addmm(gram, gram, gram, beta=b, alpha=c)  # b·M + c·M²
            X = torch.addmm(X, update, X, beta=a)  # a·X + (b·M + c·M²)·X
    else:
        lead = X.shape[:-2]
        X = X.reshape(-1, *X.shape[-2:])  # (N, A, B)
        X = X / X.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)
        for _ in range(steps):
            gram = X @ X.mT
            update = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)
            X = torch.baddbmm(X, update, X, beta=a)
        X = X.reshape(*lead, *X.shape[-2:])
    return X.mT if tall else X


def lr_scale(shape: tuple[int, int], adjust_lr_fn: str | None) -> float:
    """Multiplier on lr for one (A, B) matrix: Keller's sqrt(max(1, A/B)) or Moonlight's 0.2·sqrt(max(A, B))."""
    A, B = shape
    if adjust_lr_fn in (None, "original"):
        return math.sqrt(max(1, A / B))
    if adjust_lr_fn == "match_rms_adamw":
        return 0.2 * math.sqrt(max(A, B))
    raise ValueError(f"adjust_lr_fn must be 'original' or 'match_rms_adamw', got {adjust_lr_fn!r}")


def _orthogonalize(update: Tensor, group: dict) -> Tensor:
    """NS of a 2-D matrix, a (E, A, B) bank, or a matrix split into `group['split']` row blocks (Muon Split)."""
    split = group.get("split")
    shape = update.shape
    if split:  # (H·A_h, B) -> (H, A_h, B): each head's slice is its own matrix (GLM-5 §2.1 Muon Split)
        assert update.ndim == 2 and shape[0] % split == 0, f"cannot split {tuple(shape)} into {split} heads"
        update = update.view(split, shape[0] // split, shape[1])
    out = zeropower_via_newtonschulz(
        update, group["ns_steps"], group["ns_coefficients"], group["eps"], group.get("ns_dtype", torch.bfloat16)
    )
    return out.reshape(shape)


def _scale(shape: tuple, group: dict) -> float:
    """lr_scale of the (A, B) matrices NS sees in a parameter of this (full) shape."""
    A, B = shape[-2:]
    return lr_scale((A // group["split"] if group.get("split") else A, B), group["adjust_lr_fn"])


class Muon(Optimizer):
    """Muon over 2-D matrices and 3-D banks; per-group options `split` (heads), `adjust_lr_fn`, `ns_dtype`.

    `ns_dtype` is bf16 as in torch and Keller Jordan's code; float32 makes NS insensitive to last-bit differences
    of the gradient (used where two parallel layouts are compared, tests/dist).

    Defaults are GLM-4.5's: momentum 0.95 Nesterov, wd 0.1 (decoupled, un-scaled lr), 5 NS steps, update RMS
    matched to AdamW. Momentum is elementwise, so with FSDP2 it stays sharded; only NS sees the full matrix.
    """

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        weight_decay: float = 0.1,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_coefficients=NS_COEFFICIENTS,
        eps: float = EPS,
        ns_steps: int = 5,
        adjust_lr_fn: str | None = "match_rms_adamw",
        split: int | None = None,
        ns_dtype: torch.dtype = torch.bfloat16,
    ):
        defaults = {
            "lr": lr,
            "weight_decay": weight_decay,
            "momentum": momentum,
            "nesterov": nesterov,
            "ns_coefficients": tuple(ns_coefficients),
            "eps": eps,
            "ns_steps": ns_steps,
            "adjust_lr_fn": adjust_lr_fn,
            "split": split,
            "ns_dtype": ns_dtype,
        }
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                if p.ndim not in (2, 3):
                    raise ValueError(f"Muon takes 2-D matrices or 3-D banks, got a parameter of shape {tuple(p.shape)}")

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        sharded = []  # FSDP2 rows of matrices: NS needs the whole matrix, computed once by an owner rank
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                update = self._momentum(p, group)
                if is_sharded(update) and not local_ok(update, group):
                    sharded.append((p, update, group))
                else:  # a plain tensor, or a bank sharded over whole experts: NS on what this rank holds
                    local = update.to_local() if is_sharded(update) else update
                    self._apply(p, _orthogonalize(local, group), group)
        outs = orthogonalize_sharded([(u, g) for _, u, g in sharded], _orthogonalize)
        for (p, _, group), out in zip(sharded, outs):
            self._apply(p, out, group)
        return loss

    def _momentum(self, p: Tensor, group: dict) -> Tensor:
        """Update the momentum buffer; -> the (Nesterov) update to orthogonalise, sharded like p."""
        momentum = group["momentum"]
        state = self.state[p]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(p.grad, memory_format=torch.preserve_format)
        buf = state["momentum_buffer"]
        buf.lerp_(p.grad, 1 - momentum)  # μ·buf + (1-μ)·g
        return p.grad.lerp(buf, momentum) if group["nesterov"] else buf

    @staticmethod
    def _apply(p: Tensor, ortho: Tensor, group: dict) -> None:
        """p <- p·(1 - lr·wd) - lr·scale·ortho, on this rank's part of p (ortho is that part)."""
        lr = group["lr"]
        local = p.to_local() if is_sharded(p) else p
        local.mul_(1 - lr * group["weight_decay"])  # decoupled decay with the un-adjusted lr (as torch)
        local.add_(ortho, alpha=-lr * _scale(p.shape, group))
