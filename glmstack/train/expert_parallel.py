"""Expert parallel: routed experts split over ranks, tokens moved by all-to-all (dispatch) and back (combine).

Applied from outside by glmstack.train.dist.parallelize: every MoE layer's `experts` module (banks
gate_up_proj (E, 2F, D), down_proj (E, D, F); forward(x_TD, topk_idx_TK, topk_w_TK) -> (T, D)) is replaced by an
`ExpertParallel` holding only this rank's E/W experts under the same parameter names. Routing, the shared expert
and everything else stay replicated (DDP). The expert computation itself reuses the model's own functions
(grouped GEMM or the per-expert loop), so EP changes where tokens go, not what is computed.

Gradients: a local expert's gradient sums the contributions of every rank's tokens, while DDP averages the
replicated parameters over ranks; `_scale_grad` divides the bank's gradient by W so both match the
single-process mean loss.

Shape legend: T tokens on this rank, K experts per token, D hidden, E experts, W ranks, N = T*K routed pairs,
M pairs received by this rank.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


class _AllToAll(torch.autograd.Function):
    """all_to_all_single with autograd: the backward sends gradients back along the reversed splits."""

    @staticmethod
    def forward(ctx, x, send_splits: list[int], recv_splits: list[int]):
        ctx.splits = (send_splits, recv_splits)
        out = x.new_empty((sum(recv_splits), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), recv_splits, send_splits)
        return out

    @staticmethod
    def backward(ctx, grad):
        send_splits, recv_splits = ctx.splits
        out = grad.new_empty((sum(send_splits), *grad.shape[1:]))
        dist.all_to_all_single(out, grad.contiguous(), send_splits, recv_splits)
        return out, None, None


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, w, scale: float):
        ctx.scale = scale
        return w.view_as(w)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.scale, None


def _exchange_counts(send_W: torch.Tensor) -> torch.Tensor:
    recv_W = torch.empty_like(send_W)
    dist.all_to_all_single(recv_W, send_W)
    return recv_W


class ExpertParallel(nn.Module):
    """This rank's slice [e0, e0 + E/W) of an `Experts` bank with all-to-all dispatch and combine."""

    def __init__(self, experts: nn.Module, rank: int, world: int):
        super().__init__()
        E = experts.n_experts
        assert E % world == 0, f"{E} experts do not split over {world} ranks"
        self.n_experts, self.world, self.n_local = E, world, E // world
        self.e0 = rank * self.n_local
        self.use_grouped_mm = experts.use_grouped_mm
        sl = slice(self.e0, self.e0 + self.n_local)
        self.gate_up_proj = nn.Parameter(experts.gate_up_proj.detach()[sl].clone())  # (E/W, 2F, D)
        self.down_proj = nn.Parameter(experts.down_proj.detach()[sl].clone())  # (E/W, D, F)
        for p in (self.gate_up_proj, self.down_proj):
            p._ep_sharded = True

    def forward(self, x_TD, topk_idx_TK, topk_w_TK):
        T, K = topk_idx_TK.shape
        expert_N = topk_idx_TK.reshape(-1)
        dest_N = expert_N // self.n_local  # owning rank of each (token, expert) pair
        order_N = dest_N.argsort(stable=True)
        send_W = torch.bincount(dest_N, minlength=self.world)
        recv_W = _exchange_counts(send_W)
        send, recv = send_W.tolist(), recv_W.tolist()
        x_MD = _AllToAll.apply(x_TD[order_N // K], send, recv)  # dispatch
        local_M = _AllToAll.apply(expert_N[order_N], send, recv) - self.e0  # which local expert
        y_MD = self._compute(x_MD, local_M)
        y_ND = _AllToAll.apply(y_MD, recv, send)  # combine: back to the token's rank, in dispatch order
        y_TKD = y_ND[order_N.argsort()].view(T, K, -1)
        return torch.bmm(topk_w_TK.to(y_TKD.dtype).unsqueeze(1), y_TKD).squeeze(1)  # (T, D)

    def _compute(self, x_MD, local_M):
        """Each received pair through its one local expert (gate value 1; weighting happens at the token)."""
        from glmstack.model.moe import _grouped_mm_ok, experts_grouped, experts_loop

        w_gu = _ScaleGrad.apply(self.gate_up_proj, 1.0 / self.world)
        w_dn = _ScaleGrad.apply(self.down_proj, 1.0 / self.world)
        ones_M1 = torch.ones(local_M.shape[0], 1, device=x_MD.device)
        fn = experts_grouped if self.use_grouped_mm and _grouped_mm_ok(x_MD) else experts_loop
        return fn(x_MD, local_M[:, None], ones_M1, w_gu, w_dn)


def _ep_modules(model: nn.Module) -> list[tuple[str, ExpertParallel]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, ExpertParallel)]


def apply_expert_parallel(model: nn.Module) -> None:
    """Replace every MoE layer's `experts` with this rank's ExpertParallel slice (in place)."""
    from glmstack.model.moe import Experts

    targets = [(n, m) for n, m in model.named_modules() if isinstance(m, Experts)]
    assert targets, "expert_parallel needs a model with MoE layers"
    for name, experts in targets:
        parent = model.get_submodule(name.rpartition(".")[0])
        setattr(parent, name.rpartition(".")[2], ExpertParallel(experts, dist.get_rank(), dist.get_world_size()))


def gather_expert_state(model: nn.Module, state: dict) -> dict:
    """Put the full banks into rank 0's `state` in place of this rank's expert slices (collective: every rank
    calls it; the others keep nothing)."""
    for name, m in _ep_modules(model):
        for p_name in ("gate_up_proj", "down_proj"):
            local = getattr(m, p_name).detach().cpu().contiguous()
            parts = [torch.empty_like(local) for _ in range(m.world)] if dist.get_rank() == 0 else None
            dist.gather(local, parts, dst=0)
            if dist.get_rank() == 0:
                state[f"{name}.{p_name}"] = torch.cat(parts)
    return state
