"""Distributed training under torchrun, applied from outside the model in ONE place: `parallelize`.

The model is plain single-device PyTorch (readable; one code path). This module wraps it, in a fixed order:
  1. expert parallel (optional): each MoE layer's routed experts are split over the ranks, and the layer's
     `experts` module is replaced by `ExpertParallel`, which dispatches tokens to the rank owning their expert
     with an all-to-all and combines the results with a second one (glmstack/train/expert_parallel.py);
  2. data parallel: DDP (`DistributedDataParallel`) or FSDP2 (`fully_shard` per block, then the root).
It also owns what differs between those layouts for the trainer: the global grad norm (sharded parameters
count once), full state dicts for checkpoints, and helpers (rank, barrier, all-reduce of a scalar).

    torchrun --nproc_per_node 2 -m glmstack.cli pretrain tiny --set dist.dp=fsdp
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import nn

# ---------------------------------------------------------------- process group


def init_from_env(device_type: str = "cpu") -> None:
    """Join the process group torchrun describes (WORLD_SIZE > 1); nothing for a single process."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        backend = "nccl" if device_type == "cuda" else "gloo"
        if device_type == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT")
        if restart is None:
            dist.init_process_group(backend)
            return
        # torchrun keeps one rendezvous TCPStore across restarts: without a prefix per attempt, a restarted rank
        # can read the address a killed rank published and fail to connect (seen in tests/dist/test_elastic_launch)
        store, rank_, world_ = next(dist.rendezvous("env://"))
        store = dist.PrefixStore(f"glmstack/attempt_{restart}", store)
        dist.init_process_group(backend, store=store, rank=rank_, world_size=world_)


def shutdown() -> None:
    """Leave the process group (end of a torchrun command)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def is_dist() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return dist.get_rank() if is_dist() else 0


def world() -> int:
    return dist.get_world_size() if is_dist() else 1


def barrier() -> None:
    if is_dist():
        dist.barrier()


def mean_over_ranks(x: float) -> float:
    """The average of a Python scalar over ranks (for logging the global loss)."""
    return means_over_ranks({"x": x})["x"]


def sum_over_ranks(x: float) -> float:
    """The sum of a Python scalar over ranks."""
    return mean_over_ranks(x) * world()


def max_over_ranks(x: int) -> int:
    """The largest of an integer over ranks (e.g. a padded length every rank must share)."""
    if not is_dist():
        return x
    t = torch.tensor([x], dtype=torch.int64, device="cuda" if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def gather_objects(obj) -> list:
    """Every rank's picklable `obj`, in rank order, on every rank (one process: [obj])."""
    if not is_dist():
        return [obj]
    out = [None] * world()
    dist.all_gather_object(out, obj)
    return out


def means_over_ranks(values: dict[str, float]) -> dict[str, float]:
    """Average every scalar of a dict over ranks in one all-reduce."""
    if not is_dist() or not values:
        return values
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    t = torch.tensor(list(values.values()), dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return dict(zip(values, (t / world()).tolist()))


# ---------------------------------------------------------------- wrapping


def parallelize(model: nn.Module, dp: str, expert_parallel: bool = False, fill=None, ep: int = 0,
                find_unused: bool = False) -> nn.Module:  # fmt: skip
    """Expert parallel (over groups of `ep` ranks; 0 = all), then DDP / FSDP2; returns what the loop calls (DDP
    wraps, the others modify in place).

    fill(model): for a model built on meta, allocates and fills it (see `materialize`); called once each rank's
    layout is final (after expert parallel and FSDP2 sharding) and before DDP, which broadcasts rank 0's tensors."""
    fill = fill or (lambda m: None)
    if dp == "auto":
        dp = "ddp" if is_dist() else "none"
    if dp not in ("none", "ddp", "fsdp"):
        raise ValueError(f"dist.dp must be auto, none, ddp or fsdp, got {dp!r}")
    if not is_dist():
        fill(model)
        return model
    if expert_parallel:
        from glmstack.train.expert_parallel import apply_expert_parallel

        apply_expert_parallel(model, ep)
    if dp == "fsdp":
        from torch.distributed.fsdp import fully_shard

        experts = {p for p in model.parameters() if _is_ep(p)}  # already split by expert parallel: not re-sharded
        for block in blocks(model):
            fully_shard(block, ignored_params=experts)
        fully_shard(model, ignored_params=experts)
    fill(model)
    if dp == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        ignore = [n for n, p in model.named_parameters() if _is_ep(p)]
        DDP._set_params_and_buffers_to_ignore_for_model(model, ignore)  # expert shards differ by rank
        return DDP(model, find_unused_parameters=find_unused)
    return model


def blocks(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks FSDP shards one by one: every child of a ModuleList (`layers`, `mtp`)."""
    return [b for m in model.modules() if isinstance(m, nn.ModuleList) for b in m]


def unwrap(model: nn.Module) -> nn.Module:
    return (
        model.module if hasattr(model, "module") and isinstance(model, nn.parallel.DistributedDataParallel) else model
    )


def _is_ep(p: torch.Tensor) -> bool:
    return getattr(p, "_ep_sharded", False)


def _is_dtensor(t: torch.Tensor) -> bool:
    return hasattr(t, "full_tensor")


def optimizer_is_sharded(model: nn.Module) -> bool:
    """Whether ranks hold different optimizer state (FSDP2 shards, expert-parallel banks)."""
    return is_dist() and any(_is_dtensor(p) or _is_ep(p) for p in unwrap(model).parameters())


# ---------------------------------------------------------------- filling a sharded model


@torch.no_grad()
def materialize(model: nn.Module, device, tensors) -> None:
    """Allocate a meta-built (and possibly already parallelized) model on `device` and fill it from `tensors`, a
    stream of (state-dict name, full tensor) covering every tensor once (GLM.initial_tensors,
    hf.checkpoint_tensors). Every rank reads the same stream and keeps only its part: an FSDP2 shard
    (distribute_tensor without communication) or an expert-parallel slice. Peak memory per rank: its shard of the
    model plus one full tensor."""
    inner = unwrap(model)
    if hasattr(inner, "materialize"):  # GLM: re-ties a tied embedding after allocation
        inner.materialize(device)
    else:
        inner.to_empty(device=device)
    for _, m in _ep_modules(inner):  # to_empty made new Parameters (meta -> device), without the mark
        for p in bank_params(m).values():
            p._ep_sharded = True
    load_full_tensors(model, tensors)


@torch.no_grad()
def load_full_tensors(model: nn.Module, tensors) -> None:
    """Copy each (name, full tensor) of the stream into `model`, keeping this rank's part; every tensor of the model
    must come (a tied alias counts as its source)."""
    from torch.distributed.tensor import distribute_tensor

    inner = unwrap(model)
    own = inner.state_dict()
    ep = {f"{name}.{p}": m for name, m in _ep_modules(inner) for p in bank_params(m)}
    seen = set()
    for name, full in tensors:
        if name not in own:
            raise KeyError(f"{name}: not a tensor of this model")
        t = own[name]
        if name in ep and full.shape[0] == ep[name].n_experts:
            m = ep[name]
            full = full[m.e0 : m.e0 + m.n_local]
        if _is_dtensor(t):
            full = distribute_tensor(full.to(t.device, t.dtype), t.device_mesh, t.placements, src_data_rank=None)
            t, full = t.to_local(), full.to_local()
        t.copy_(full)
        seen.add(name)
    aliases = {n for n, t in own.items() if any(t is own[s] for s in seen)}
    missing = set(own) - seen - aliases
    if missing:
        raise KeyError(f"nothing filled {sorted(missing)[:5]}{' ...' if len(missing) > 5 else ''}")


def reduce_expert_grads(model: nn.Module) -> None:
    """Complete expert-parallel banks' gradients over the ranks that hold the same experts (dist.ep < world)."""
    from glmstack.train.expert_parallel import reduce_expert_grads as reduce

    reduce(unwrap(model))


def _ep_modules(model: nn.Module) -> list:
    from glmstack.train.expert_parallel import _ep_modules as ep_modules

    return ep_modules(model)


def bank_params(m: nn.Module) -> dict:
    from glmstack.train.expert_parallel import bank_params as params

    return params(m)


# ---------------------------------------------------------------- gradients


@torch.no_grad()
def clip_grad_norm_(model: nn.Module, max_norm: float) -> float:
    """Global grad L2 norm (each element counted once across ranks), clipped to max_norm when > 0.

    Replicated gradients (single process, DDP) are identical on every rank and count once; FSDP2 shards differ by
    rank, so their squared sums are all-reduced; expert-parallel banks differ within an expert group and repeat
    across groups (reduce_expert_grads made them equal), so theirs are all-reduced over the expert group.
    """
    params = [p for p in unwrap(model).parameters() if p.grad is not None]
    if not params:
        return 0.0
    local = [p.grad.to_local() if _is_dtensor(p.grad) else p.grad for p in params]  # this rank's elements
    sq = torch.stack(torch._foreach_norm(local)).double().square()  # one kernel per dtype/device, not per tensor
    fsdp_mask = torch.tensor([_is_dtensor(p.grad) for p in params], device=sq.device)
    ep_mask = torch.tensor([_is_ep(p) for p in params], device=sq.device)
    replicated, sharded, experts = sq[~(fsdp_mask | ep_mask)].sum(), sq[fsdp_mask].sum(), sq[ep_mask].sum()
    if is_dist():
        dist.all_reduce(sharded)
        if ep_mask.any():
            dist.all_reduce(experts, group=_ep_modules(unwrap(model))[0][1].group)
    norm = float((replicated + sharded + experts).sqrt())
    if max_norm > 0 and norm > max_norm:
        torch._foreach_mul_(local, max_norm / (norm + 1e-6))
    return norm


# ---------------------------------------------------------------- state dicts


def full_state_dict(model: nn.Module, everywhere: bool = False) -> dict[str, torch.Tensor]:
    """Unsharded CPU state dict (collective: call on every rank). Only rank 0 keeps it (the others get {}), and
    each sharded tensor is gathered one at a time, so no other rank ever holds the whole model; `everywhere`:
    every rank keeps it (RL: each rank's rollout engine runs the whole policy)."""
    inner = unwrap(model)
    from glmstack.train.expert_parallel import gather_expert_state

    keep = everywhere or rank() == 0
    state = {}
    for name, t in inner.state_dict().items():
        if _is_dtensor(t):
            t = t.full_tensor()
        if keep:
            state[name] = t.detach().cpu().clone()
    state = gather_expert_state(inner, state, everywhere)
    return state if keep else {}


def load_full_state_dict(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copy an unsharded state dict into `model`, keeping each rank's shard (FSDP2 / expert parallel)."""
    load_full_tensors(model, state.items())


def plain_copy(model: nn.Module, state: dict[str, torch.Tensor]) -> nn.Module:
    """An unwrapped single-device GLM holding `state`'s tensors themselves (no copy; for save_hf of a sharded
    model on rank 0)."""
    if not is_dist():
        return model
    from glmstack.model import GLM

    copy = GLM(model.cfg)
    copy.load_state_dict(state, assign=True)
    return copy
