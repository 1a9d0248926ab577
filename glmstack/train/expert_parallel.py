"""Expert parallel: routed experts split over ranks, tokens moved by all-to-all (dispatch) and back (combine).

Applied from outside by glmstack.train.dist.parallelize: every MoE layer's `experts` module (banks
gate_up_proj (E, 2F, D), down_proj (E, D, F); forward(x_TD, topk_idx_TK, topk_w_TK) -> (T, D)) is replaced by an
`ExpertParallel` holding only this rank's E/W experts under the same parameter names. Routing, the shared expert
and everything else stay replicated (DDP). The expert computation itself reuses the model's own functions
(grouped GEMM or the per-expert loop), so EP changes where tokens go, not what is computed.

EP over a sub-group (`dist.ep`, GLM-4.5V's EP 8 beside other parallelism): the world's N ranks form a mesh
(N/W replicas, W ranks per expert group); tokens move only within a rank's expert group (ranks r with the same
r // W), and the ranks holding the same experts in different groups (the replica group) are data parallel for
the banks.

Gradients: a local expert's gradient sums the contributions of its expert group's tokens, while DDP averages the
replicated parameters over all N ranks; `_ScaleGrad` divides the bank's gradient by N, and `reduce_expert_grads`
sums it over the replica group, so both match the single-process mean loss.

Shape legend: T tokens on this rank, K experts per token, D hidden, E experts, W ranks per expert group,
N = T*K routed pairs, M pairs received by this rank.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


class _AllToAll(torch.autograd.Function):
    """all_to_all_single with autograd: the backward sends gradients back along the reversed splits."""

    @staticmethod
    def forward(ctx, x, send_splits: list[int], recv_splits: list[int], group):
        ctx.splits, ctx.group = (send_splits, recv_splits), group
        out = x.new_empty((sum(recv_splits), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), recv_splits, send_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        send_splits, recv_splits = ctx.splits
        out = grad.new_empty((sum(send_splits), *grad.shape[1:]))
        dist.all_to_all_single(out, grad.contiguous(), send_splits, recv_splits, group=ctx.group)
        return out, None, None, None


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, w, scale: float):
        ctx.scale = scale
        return w.view_as(w)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.scale, None


def _exchange_counts(send_W: torch.Tensor, group) -> torch.Tensor:
    recv_W = torch.empty_like(send_W)
    dist.all_to_all_single(recv_W, send_W, group=group)
    return recv_W


class ExpertParallel(nn.Module):
    """This rank's slice [e0, e0 + E/W) of an `Experts` bank with all-to-all dispatch and combine."""

    def __init__(self, experts: nn.Module, mesh):
        super().__init__()
        E, world = experts.n_experts, mesh["ep"].size()
        if E % world:
            from glmstack.config import ConfigError

            raise ConfigError(f"dist.ep={world}: {E} experts do not split over {world} ranks")
        self.mesh, self.group = mesh, mesh["ep"].get_group()
        self.n_experts, self.world, self.n_local = E, world, E // world
        self.grad_scale = 1.0 / dist.get_world_size()  # DDP's mean over all ranks
        self.e0 = mesh["ep"].get_local_rank() * self.n_local
        self.use_grouped_mm = experts.use_grouped_mm
        sl = slice(self.e0, self.e0 + self.n_local)
        # (E/W, 2F, D) and (E/W, D, F); frozen stays frozen (a LoRA base)
        self.gate_up_proj = nn.Parameter(experts.gate_up_proj.detach()[sl].clone(), experts.gate_up_proj.requires_grad)
        self.down_proj = nn.Parameter(experts.down_proj.detach()[sl].clone(), experts.down_proj.requires_grad)
        for p in (self.gate_up_proj, self.down_proj):
            p._ep_sharded = True

    def banks(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's (gate_up (E/W, 2F, D), down (E/W, D, F)); LoRA adds its per-expert deltas here."""
        return self.gate_up_proj, self.down_proj

    def forward(self, x_TD, topk_idx_TK, topk_w_TK):
        T, K = topk_idx_TK.shape
        expert_N = topk_idx_TK.reshape(-1)
        dest_N = expert_N // self.n_local  # owning rank of each (token, expert) pair
        order_N = dest_N.argsort(stable=True)
        send_W = torch.bincount(dest_N, minlength=self.world)
        recv_W = _exchange_counts(send_W, self.group)
        send, recv = send_W.tolist(), recv_W.tolist()
        x_MD = _AllToAll.apply(x_TD[order_N // K], send, recv, self.group)  # dispatch
        local_M = _AllToAll.apply(expert_N[order_N], send, recv, self.group) - self.e0  # which local expert
        y_MD = self._compute(x_MD, local_M)
        y_ND = _AllToAll.apply(y_MD, recv, send, self.group)  # combine: back to the token's rank, in dispatch order
        y_TKD = y_ND[order_N.argsort()].view(T, K, -1)
        return torch.bmm(topk_w_TK.to(y_TKD.dtype).unsqueeze(1), y_TKD).squeeze(1)  # (T, D)

    def _compute(self, x_MD, local_M):
        """Each received pair through its one local expert (gate value 1; weighting happens at the token)."""
        from glmstack.model.moe import _grouped_mm_ok, experts_grouped, experts_loop

        w_gu, w_dn = (_ScaleGrad.apply(w, self.grad_scale) for w in self.banks())
        ones_M1 = torch.ones(local_M.shape[0], 1, device=x_MD.device)
        fn = experts_grouped if self.use_grouped_mm and _grouped_mm_ok(x_MD) else experts_loop
        return fn(x_MD, local_M[:, None], ones_M1, w_gu, w_dn)


def _ep_modules(model: nn.Module) -> list[tuple[str, ExpertParallel]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, ExpertParallel)]


def bank_params(m: nn.Module) -> dict[str, nn.Parameter]:
    """Parameter name (within the module) -> parameter of everything split by expert: the two banks and, under LoRA,
    their per-expert adapters (E first, like the banks: model/lora.py)."""
    out = {"gate_up_proj": m.gate_up_proj, "down_proj": m.down_proj}
    for kind in ("lora_A", "lora_B"):
        for bank, p in getattr(m, kind, {}).items():
            out[f"{kind}.{bank}"] = p
    return out


def _carry_adapters(src: nn.Module, dst: ExpertParallel) -> None:
    """A LoRA bank's per-expert adapters follow its experts onto this rank (on meta: filled later by materialize)."""
    from glmstack.model import lora

    if not isinstance(src, lora.LoraExperts):
        return
    sl = slice(dst.e0, dst.e0 + dst.n_local)
    for bank in src.lora_A:
        lora.add_bank_adapter(dst, bank, src.lora_A[bank].shape[1], src.lora_scaling[bank], src.lora_A[bank].dtype)
        with torch.no_grad():
            for kind in ("lora_A", "lora_B"):
                getattr(dst, kind)[bank] = nn.Parameter(getattr(src, kind)[bank].detach()[sl].clone())
    for p in bank_params(dst).values():
        p._ep_sharded = True


def expert_mesh(degree: int):
    """The (replica, ep) device mesh: `degree` ranks per expert group (0 = all ranks), consecutive ranks together
    (on one node, where the all-to-alls are cheapest)."""
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()
    degree = degree or world
    if degree < 1 or world % degree:
        from glmstack.config import ConfigError

        raise ConfigError(f"dist.ep={degree} must divide the number of ranks ({world})")
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    return init_device_mesh(device, (world // degree, degree), mesh_dim_names=("replica", "ep"))


def apply_expert_parallel(model: nn.Module, degree: int = 0) -> None:
    """Replace every MoE layer's `experts` with this rank's ExpertParallel slice (in place)."""
    from glmstack.model.moe import Experts

    targets = [(n, m) for n, m in model.named_modules() if isinstance(m, Experts)]
    assert targets, "expert_parallel needs a model with MoE layers"
    mesh = expert_mesh(degree)
    for name, experts in targets:
        parent = model.get_submodule(name.rpartition(".")[0])
        ep = ExpertParallel(experts, mesh)
        _carry_adapters(experts, ep)
        setattr(parent, name.rpartition(".")[2], ep)


@torch.no_grad()
def reduce_expert_grads(model: nn.Module) -> None:
    """Sum the banks' gradients over the replica group (ranks holding the same experts in other expert groups);
    nothing to do when one expert group spans all ranks. One all-reduce per step."""
    mods = _ep_modules(model)
    if not mods or mods[0][1].mesh["replica"].size() == 1:
        return
    grads = [p.grad for _, m in mods for p in bank_params(m).values() if p.grad is not None]
    if grads:
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=mods[0][1].mesh["replica"].get_group())
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()


def gather_expert_state(model: nn.Module, state: dict, everywhere: bool = False) -> dict:
    """Put the full banks into rank 0's `state` in place of this rank's expert slices (collective over rank 0's
    expert group, whose ranks hold every expert once; the others keep nothing). `everywhere`: into every rank's
    (an all-gather in each expert group)."""
    for name, m in _ep_modules(model):
        if everywhere:
            for p_name, p in bank_params(m).items():
                local = p.detach().contiguous()
                parts = [torch.empty_like(local) for _ in range(m.world)]
                dist.all_gather(parts, local, group=m.group)
                state[f"{name}.{p_name}"] = torch.cat(parts).cpu()
            continue
        if m.mesh["replica"].get_local_rank() != 0:
            continue
        for p_name, p in bank_params(m).items():
            local = p.detach().contiguous()  # on its device: NCCL gathers no CPU tensors
            parts = [torch.empty_like(local) for _ in range(m.world)] if dist.get_rank() == 0 else None
            dist.gather(local, parts, group_dst=0, group=m.group)
            if dist.get_rank() == 0:
                state[f"{name}.{p_name}"] = torch.cat(parts).cpu()
    return state
