"""Two gloo processes on CPU (DDP, FSDP2, expert parallel) give the single-process loss for the same global batch.

Expert parallel (and DDP with accumulation) sums gradients in a different order than one process does (last-bit
differences); bf16 Newton–Schulz turns those into visible update differences within a few steps, so those cases
compare with fp32 NS on both sides (optim.ns_dtype=float32): what is tested is the parallelism, not bf16 rounding.

The single-process reference accumulates the two ranks' micro-batches (the synthetic loader gives rank r the
batches r, r+W, ...), so every step sees exactly the same tokens; losses must agree within 1e-5 relative.
"""

import json
import os

import pytest
import torch.multiprocessing as mp
from tiny_runs import TINY, free_port

from glmstack.recipes import load_config
from glmstack.train.stage import run

pytestmark = pytest.mark.dist
STEPS = 4
BASE = TINY + [f"steps={STEPS}", "ckpt.every=0"]


def _worker(rank, world, port, overrides, stop_at=None):
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank)
    )
    import torch

    torch.set_num_threads(1)
    run(load_config("tiny", "pretrain", overrides), stop_at=stop_at)
    torch.distributed.destroy_process_group()


def _losses(out_dir):
    rows = (out_dir / "tiny" / "pretrain" / "metrics.jsonl").read_text().splitlines()
    return [json.loads(r)["loss"] for r in rows]


_REFERENCES = {}


def _reference(tmp_path_factory, extra: tuple[str, ...], accum: int = 1) -> list[float]:
    """Single-process losses with the two ranks' micro-batches (accum each) accumulated in one step."""
    if (extra, accum) not in _REFERENCES:
        out = tmp_path_factory.mktemp("single")
        run(load_config("tiny", "pretrain", BASE + list(extra) + [f"grad_accum={2 * accum}", f"out_dir={out}"]))
        _REFERENCES[(extra, accum)] = _losses(out)
    return _REFERENCES[(extra, accum)]


@pytest.mark.parametrize(
    "mode,extra",
    [
        (["dist.dp=ddp"], ()),
        # no_sync on the first micro-batch, all-reduce on the last; sums in another order, so fp32 NS as for EP
        (["dist.dp=ddp", "grad_accum=2"], ("optim.ns_dtype=float32",)),
        (["dist.dp=fsdp"], ()),
        (["dist.dp=ddp", "dist.expert_parallel=true"], ("optim.ns_dtype=float32",)),
        (["dist.dp=fsdp", "dist.expert_parallel=true"], ("optim.ns_dtype=float32",)),
    ],
    ids=["ddp", "ddp-accum", "fsdp", "ep", "ep-fsdp"],
)
def test_two_ranks_match_single_process(tmp_path, tmp_path_factory, mode, extra):
    reference = _reference(tmp_path_factory, extra, accum=2 if "grad_accum=2" in mode else 1)
    mp.spawn(_worker, args=(2, free_port(), BASE + mode + list(extra) + [f"out_dir={tmp_path}"]), nprocs=2, join=True)
    losses = _losses(tmp_path)
    assert len(losses) == STEPS == len(reference)
    print(f"{mode}: max relative loss difference {max(abs(a - b) / abs(b) for a, b in zip(losses, reference)):.2e}")
    for a, b in zip(losses, reference):
        assert abs(a - b) <= 1e-5 * abs(b), (losses, reference)
    # the checkpoint is a complete, unsharded model folder
    latest = (tmp_path / "tiny" / "pretrain" / "latest").read_text().strip()
    assert (tmp_path / "tiny" / "pretrain" / latest / "config.json").exists()


@pytest.mark.parametrize(
    "mode,extra",
    [
        (["dist.dp=fsdp"], ()),
        (["dist.dp=ddp", "dist.expert_parallel=true"], ("optim.ns_dtype=float32",)),
        (["dist.dp=fsdp", "dist.expert_parallel=true"], ("optim.ns_dtype=float32",)),
    ],
    ids=["fsdp", "ep", "ep-fsdp"],
)
def test_sharded_resume_continues_the_run(tmp_path, tmp_path_factory, mode, extra):
    """Stop after 2 steps, resume in fresh processes: per-rank optimizer shards and full weights reload."""
    reference = _reference(tmp_path_factory, extra)
    overrides = BASE + mode + list(extra) + [f"out_dir={tmp_path}"]
    mp.spawn(_worker, args=(2, free_port(), overrides, 2), nprocs=2, join=True)
    assert (tmp_path / "tiny" / "pretrain" / "latest").read_text().strip() == "step_0000002"
    mp.spawn(_worker, args=(2, free_port(), overrides), nprocs=2, join=True)
    losses = _losses(tmp_path)
    assert len(losses) == STEPS
    for a, b in zip(losses, reference):
        assert abs(a - b) <= 1e-5 * abs(b), (losses, reference)


@pytest.mark.slow
def test_expert_parallel_over_sub_groups_and_resume_on_two_ranks(tmp_path, tmp_path_factory):
    """4 ranks as 2 expert groups of 2 (dist.ep=2: EP x data parallel), stopped after 2 steps and continued on 2
    ranks (EP over both, 2 micro-batches each) from the DCP checkpoint, whose banks were saved once per expert, not
    once per replica: the losses of 2 ranks with EP 2 on the same 4 micro-batches per step, uninterrupted.

    The reference is EP too: the expert GEMMs then run the same kernels on both sides (one process computes its
    experts another way, which alone moves the loss by ~1e-5 in 4 steps), and only summation order differs (the
    replica all-reduce, accumulation), so the 1e-5 bound of this file holds. A bank gradient missing the other
    expert group's tokens, or counted twice, moves the step-2 loss by far more."""
    overrides = BASE + ["dist.dp=ddp", "dist.expert_parallel=true", "optim.ns_dtype=float32"]
    ref_dir = tmp_path_factory.mktemp("ep2")
    mp.spawn(_worker, args=(2, free_port(), overrides + ["grad_accum=2", f"out_dir={ref_dir}"]), nprocs=2, join=True)
    reference = _losses(ref_dir)
    overrides += [f"out_dir={tmp_path}"]
    mp.spawn(_worker, args=(4, free_port(), overrides + ["dist.ep=2"], 2), nprocs=4, join=True)
    mp.spawn(_worker, args=(2, free_port(), overrides + ["grad_accum=2"]), nprocs=2, join=True)
    losses = _losses(tmp_path)
    assert len(losses) == STEPS
    print(f"max relative loss difference {max(abs(a - b) / abs(b) for a, b in zip(losses, reference)):.2e}")
    for a, b in zip(losses, reference):
        assert abs(a - b) <= 1e-5 * abs(b), (losses, reference)
