"""Muon on FSDP2-sharded parameters equals Muon on the whole parameters, bit for bit, and each matrix's
Newton–Schulz runs on one rank only (owner gathers, orthogonalises, scatters; expert banks stay local).

Two gloo processes shard a stack of matrices of uneven heights (rows not divisible by 2, fewer rows than ranks
would leave one block empty) plus an expert bank and a Muon-Split matrix; three Muon steps with fixed gradients
are compared with the same steps in one process.
"""

import json
import os
import socket

import pytest
import torch
import torch.multiprocessing as mp
from torch import nn

from glmstack.optim import muon as muon_module
from glmstack.optim.muon import Muon

pytestmark = pytest.mark.dist
SHAPES = [(7, 5), (16, 12), (3, 9), (33, 8)]  # 2-D matrices
BANK = (4, 6, 5)  # (E, A, B)


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.mats = nn.ParameterList(nn.Parameter(torch.randn(*s)) for s in SHAPES)
        self.bank = nn.Parameter(torch.randn(*BANK))
        self.split = nn.Parameter(torch.randn(8, 6))  # 2 heads of 4 rows


def _grads(step: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return [torch.randn(*s, generator=g) for s in [*SHAPES, BANK, (8, 6)]]


def _optimizer(model):
    params = [*model.mats, model.bank]
    return Muon([{"params": params}, {"params": [model.split], "blocks": (2, (4,))}], lr=0.02, ns_dtype=torch.float32)


def _run(model, opt, shard=lambda g, p: g):
    for step in range(3):
        for p, g in zip([*model.mats, model.bank, model.split], _grads(step)):
            p.grad = shard(g, p)
        opt.step()


def _worker(rank, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo")
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import distribute_tensor

    torch.manual_seed(0)
    model = Stack()
    fully_shard(model)
    calls = []
    ns = muon_module.zeropower_via_newtonschulz

    def counted(G, *a, **k):
        calls.append(tuple(G.shape))
        return ns(G, *a, **k)

    muon_module.zeropower_via_newtonschulz = counted
    shard = lambda g, p: distribute_tensor(g, p.device_mesh, p.placements, src_data_rank=None)
    _run(model, _optimizer(model), shard)
    state = {n: p.full_tensor() for n, p in model.named_parameters()}
    if rank == 0:
        torch.save(state, out / "state.pt")
    (out / f"calls_{rank}.json").write_text(json.dumps(calls))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def test_sharded_muon_equals_whole_muon_and_splits_the_work(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(port, tmp_path), nprocs=2, join=True)
    torch.manual_seed(0)
    reference = Stack()
    _run(reference, _optimizer(reference))
    state = torch.load(tmp_path / "state.pt")
    for name, p in reference.named_parameters():
        assert torch.equal(state[name], p.detach()), name
    calls = [[tuple(c) for c in json.loads((tmp_path / f"calls_{r}.json").read_text())] for r in range(2)]
    # NS always sees a stack (N, A, B): a sharded matrix is a stack of one on its owner rank
    matrices = [c[1:] for c in calls[0] + calls[1] if c[0] == 1]
    assert sorted(matrices) == sorted([s for s in SHAPES] * 3)  # each 2-D NS once per step, on one rank
    assert sorted(c for rank_calls in calls for c in rank_calls if c[1:] == (4, 6)) == [(2, 4, 6)] * 3  # split heads
    assert all(len(rank_calls) > 0 for rank_calls in calls)  # both ranks own some
    banks = [[c for c in rank_calls if len(c) == 3 and c[1:] == BANK[1:]] for rank_calls in calls]
    assert banks == [[(2, *BANK[1:])] * 3] * 2  # each rank orthogonalises its own 2 experts, locally
