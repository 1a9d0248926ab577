"""Newton–Schulz for FSDP2-sharded Muon parameters: each matrix orthogonalised once, on one rank.

Why: NS needs a whole matrix, and FSDP2 gives each rank a block of rows. Gathering every matrix on every rank
(`DTensor.full_tensor`) makes all W ranks run the same NS W times over and hold each full matrix. Moonlight
(arXiv 2502.16982, Alg. 1) instead gives each matrix an owner: the owner gathers the row blocks, runs NS, and
scatters the result back, so NS work and the full copies are split W ways at the same communication volume.
Expert banks (E, A, B) sharded over E need none of this: each rank holds whole experts, whose NS is local
(`local_ok`).

    pending = [(update_dtensor, group), ...]        # the step's sharded updates, in Muon.step's order
    local_outs = orthogonalize_sharded(pending, muon._orthogonalize)

Every rank must pass the same list in the same order (the parameter groups make it so). The result equals
`_orthogonalize(update.full_tensor())` sliced to the rank's rows, bit for bit (tests/dist/test_muon_sharded.py).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor


def is_sharded(t: Tensor) -> bool:
    return hasattr(t, "full_tensor")


def local_ok(update: Tensor, group: dict) -> bool:
    """A bank sharded over its experts (Shard(0) of (E, A, B)): whole experts, so all their blocks, on each rank."""
    from torch.distributed.tensor import Shard

    return update.ndim == 3 and tuple(update.placements) == (Shard(0),)


def orthogonalize_sharded(pending: list[tuple[Tensor, dict]], orthogonalize) -> list[Tensor]:
    """[(DTensor update, group)] -> [this rank's rows of NS(full update)], each NS run by one owner.

    `orthogonalize(full, group) -> out` is muon._orthogonalize. Owners are assigned greedily by size so
    the NS work is balanced; gathers and scatters are issued asynchronously, all at once."""
    if not pending:
        return []
    mesh = pending[0][0].device_mesh
    pg = mesh.get_group()
    world, me = dist.get_world_size(pg), dist.get_rank(pg)
    owners = _assign_owners([u.numel() for u, _ in pending], world)
    gathered, works = [], []
    for (update, _), owner in zip(pending, owners):
        send = _padded_block(update, world)
        parts = [torch.empty_like(send) for _ in range(world)] if me == owner else None
        works.append(dist.gather(send, parts, dst=dist.get_global_rank(pg, owner), group=pg, async_op=True))
        gathered.append(parts)
    for w in works:
        w.wait()
    results, works = [], []
    for (update, group), owner, parts in zip(pending, owners, gathered):
        chunks = None
        if me == owner:
            out = orthogonalize(torch.cat(parts)[: update.shape[0]], group).to(update.dtype)  # bf16 NS -> exact
            chunks = list(_padded_blocks(out, world))
        recv = torch.empty_like(_padded_block(update, world))
        works.append(dist.scatter(recv, chunks, src=dist.get_global_rank(pg, owner), group=pg, async_op=True))
        results.append(recv)
    for w in works:
        w.wait()
    return [recv[: update.to_local().shape[0]] for recv, (update, _) in zip(results, pending)]


def _assign_owners(sizes: list[int], world: int) -> list[int]:
    """Largest first to the least loaded rank: deterministic, so every rank computes the same assignment."""
    load, owners = [0] * world, [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        r = min(range(world), key=lambda r: (load[r], r))
        owners[i], load[r] = r, load[r] + sizes[i]
    return owners


def _rows_per_rank(n: int, world: int) -> int:
    return -(-n // world)  # FSDP2's Shard(0) is torch.chunk: ceil(n / world) rows, the last blocks shorter or empty


def _padded_block(update: Tensor, world: int) -> Tensor:
    """This rank's rows, zero-padded to the common block height (collectives need equal sizes)."""
    local = update.to_local()
    c = _rows_per_rank(update.shape[0], world)
    out = local.new_zeros((c, *local.shape[1:]))
    out[: local.shape[0]] = local
    return out


def _padded_blocks(full: Tensor, world: int):
    c = _rows_per_rank(full.shape[0], world)
    for r in range(world):
        block = full.new_zeros((c, *full.shape[1:]))
        rows = full[r * c : (r + 1) * c]
        block[: rows.shape[0]] = rows
        yield block
