"""Muon for hidden matrices and 3-D expert banks, with the GLM-4.5 settings.

Muon (Jordan et al. 2024; Moonlight, arXiv 2502.16982) replaces the Adam update of a weight matrix by the
orthogonalised momentum: U S Vᵀ -> ~U Vᵀ via 5 quintic Newton–Schulz steps. GLM-4.5 (arXiv 2508.06471 §2.4) uses
N = 5, μ = 0.95 (Nesterov), decoupled weight decay 0.1 and scales the update to AdamW's RMS with
0.2·sqrt(max(A, B)) ("match_rms_adamw"), so Muon reuses AdamW's learning rate.

Why our own class rather than `torch.optim.Muon`: torch's rejects 3-D parameters, and expert banks (E, out, in)
must be orthogonalised per expert as a batch; GLM-5's Muon Split orthogonalises each head's slice of a matrix
(the `blocks` option of a parameter group); and FSDP2 shards parameters, so the NS step must see the full
matrix: one owner rank per matrix gathers it, runs NS and scatters the rows back (muon_sharded.py), while banks
sharded over whole experts run NS where they are. On plain 2-D parameters this class runs the exact op sequence of torch 2.13's Muon and
`tests/unit/test_optim_muon.py` checks they agree bit for bit.

Which matrices Newton–Schulz sees is the Muon block rule (docs/training.md, "Muon blocks"): one block per matrix
the papers name, so a fused parameter is cut back into its parts (a group's `blocks` spec, see `blocks_of`):
routed experts' [W_gate; W_up] bank rows, MLA's [W^DKV; W^KR], and per head GLM-5's Muon Split of the MLA
up-projections, [W^UQ; W^QR] and [W^UK; W^UV]. Each block gets its own RMS-matching lr scale.

Shapes: A, B = rows, cols of one matrix (for nn.Linear: out, in); a bank is (E, A, B); a blocked matrix
(H·Σr, B) is orthogonalised as H·len(r) matrices (r_i, B).
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


def blocks_of(shape: tuple, spec) -> list[tuple[int, int, int]]:
    """(heads, row offset within a head, rows) of every Newton–Schulz block of a (..., R, C) matrix.

    spec = None: the whole matrix; (H, (r1, r2, ...)): R = H·Σr, each head's rows are [r1; r2; ...] and every
    (head, piece) is its own matrix (the Muon block rule, docs/training.md: one block per matrix the papers name)."""
    if not spec:
        return [(1, 0, shape[-2])]
    heads, rows = spec
    assert shape[-2] == heads * sum(rows), f"cannot cut {tuple(shape)} into {heads} heads of rows {rows}"
    offsets = [sum(rows[:i]) for i in range(len(rows))]
    return [(heads, off, r) for off, r in zip(offsets, rows)]


def _piece(t: Tensor, spec, heads: int, off: int, rows: int) -> Tensor:
    """The (..., heads, rows, C) view of one block kind of `t` (..., R, C)."""
    if not spec:
        return t.unsqueeze(-3)
    return t.unflatten(-2, (heads, t.shape[-2] // heads))[..., off : off + rows, :]


def orthogonalize_many(items: list[tuple[Tensor, dict]]) -> list[Tensor]:
    """NS of every block of every (update, group): blocks of one shape (and NS settings) from all parameters are
    stacked into one batch, so a step runs one Newton–Schulz per block shape instead of one per parameter. The
    batched iteration gives each matrix the bits the 2-D one gives it (tests/unit/test_optim_muon.py)."""
    buckets: dict[tuple, list] = {}
    outs = []
    for update, group in items:
        spec = group.get("blocks")
        dtype = group.get("ns_dtype", torch.bfloat16)
        out = torch.empty(update.shape, dtype=dtype, device=update.device)
        outs.append(out)
        for heads, off, rows in blocks_of(update.shape, spec):
            src = _piece(update, spec, heads, off, rows)
            key = (rows, update.shape[-1], group["ns_steps"], group["ns_coefficients"], group["eps"], dtype)
            buckets.setdefault(key, []).append((src, _piece(out, spec, heads, off, rows)))
    for (rows, cols, steps, coefficients, eps, dtype), pairs in buckets.items():
        sizes = [src[..., 0, 0].numel() for src, _ in pairs]
        stacked = pairs[0][0].new_empty((sum(sizes), rows, cols), dtype=dtype)  # (N, rows, cols)
        for (src, _), part in zip(pairs, stacked.split(sizes)):
            part.view(src.shape).copy_(src)  # the cast to the NS dtype and the stacking in one pass (== .to(dtype))
        ortho = zeropower_via_newtonschulz(stacked, steps, coefficients, eps, dtype)
        for (src, dst), part in zip(pairs, ortho.split(sizes)):
            dst.copy_(part.view(dst.shape))
    return outs


def _orthogonalize(update: Tensor, group: dict) -> Tensor:
    """NS of one 2-D matrix or (E, A, B) bank, block by block (muon_sharded's owner rank calls this)."""
    return orthogonalize_many([(update, group)])[0]


def _scales(shape: tuple, group: dict) -> list[float]:
    """lr_scale of each block kind of a parameter of this (full) shape."""
    return [lr_scale((rows, shape[-1]), group["adjust_lr_fn"]) for _, _, rows in blocks_of(shape, group.get("blocks"))]


class Muon(Optimizer):
    """Muon over 2-D matrices and 3-D banks; per-group options `blocks` (Muon block rule), `adjust_lr_fn`, `ns_dtype`.

    `ns_dtype` is bf16 as in torch and Keller Jordan's code; float32 makes NS insensitive to last-bit differences
    of the gradient (used where two parallel layouts are compared, tests/dist).

    Defaults are GLM-4.5's: momentum 0.95 Nesterov, wd 0.1 (decoupled, un-scaled lr), 5 NS steps, update RMS
    matched to AdamW. Momentum is elementwise, so with FSDP2 it stays sharded; only NS sees the full matrix.
    One step: momentum of every parameter with foreach ops, NS once per block shape (orthogonalize_many), the
    update applied with foreach ops per (lr, scale): no per-parameter Python loop of small kernels.
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
        blocks=None,
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
            "blocks": blocks,
            "ns_dtype": ns_dtype,
        }
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                if p.ndim not in (2, 3):
                    raise ValueError(f"Muon takes 2-D matrices or 3-D banks, got a parameter of shape {tuple(p.shape)}")
                blocks_of(p.shape, group["blocks"])  # fails early on a spec that does not fit

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        local, sharded = [], []  # sharded: FSDP2 rows of matrices; NS needs the whole matrix, run by an owner rank
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            for p, update in zip(params, self._momenta(params, group)):
                if is_sharded(update) and not local_ok(update, group):
                    sharded.append((p, update, group))
                else:  # a plain tensor, or a bank sharded over whole experts: NS on what this rank holds
                    local.append((p, update.to_local() if is_sharded(update) else update, group))
        outs = orthogonalize_many([(u, g) for _, u, g in local])
        outs += orthogonalize_sharded([(u, g) for _, u, g in sharded], _orthogonalize)
        self._apply_all([(p, out, g) for (p, _, g), out in zip(local + sharded, outs)])
        return loss

    def _momenta(self, params: list[Tensor], group: dict) -> list[Tensor]:
        """Update the momentum buffers; -> the (Nesterov) updates to orthogonalise, sharded like the params."""
        momentum = group["momentum"]
        for p in params:
            if "momentum_buffer" not in self.state[p]:
                self.state[p]["momentum_buffer"] = torch.zeros_like(p.grad, memory_format=torch.preserve_format)
        bufs = [self.state[p]["momentum_buffer"] for p in params]
        grads = [p.grad for p in params]
        if not params or any(is_sharded(g) for g in grads):  # DTensors: one at a time
            for b, g in zip(bufs, grads):
                b.lerp_(g, 1 - momentum)
            return [g.lerp(b, momentum) for g, b in zip(grads, bufs)] if group["nesterov"] else bufs
        torch._foreach_lerp_(bufs, grads, 1 - momentum)  # μ·buf + (1-μ)·g
        return list(torch._foreach_lerp(grads, bufs, momentum)) if group["nesterov"] else bufs

    @staticmethod
    def _apply_all(items: list[tuple[Tensor, Tensor, dict]]) -> None:
        """p <- p·(1 - lr·wd) - lr·scale·ortho for every (p, ortho, group), on this rank's part of p (ortho is that
        part); foreach over the parameters that share a decay factor, then over those that share lr·scale."""
        decay, add = {}, {}
        for p, ortho, group in items:
            lr, local = group["lr"], p.to_local() if is_sharded(p) else p
            decay.setdefault(1 - lr * group["weight_decay"], []).append(local)  # decoupled, un-adjusted lr (torch)
            scales = _scales(p.shape, group)
            if len(set(scales)) == 1:
                add.setdefault(-lr * scales[0], []).append((local, ortho))
                continue
            assert not is_sharded(p), f"per-block lr scales {scales} on a sharded {tuple(p.shape)} matrix"
            spec = group["blocks"]
            for (heads, off, rows), scale in zip(blocks_of(p.shape, spec), scales):
                add.setdefault(-lr * scale, []).append(
                    (_piece(local, spec, heads, off, rows), _piece(ortho, spec, heads, off, rows))
                )
        for factor, tensors in decay.items():
            torch._foreach_mul_(tensors, factor)
        for alpha, pairs in add.items():
            torch._foreach_add_([t for t, _ in pairs], [o for _, o in pairs], alpha=alpha)
