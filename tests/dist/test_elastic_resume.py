"""A 2-rank FSDP2 run stopped at step 2 resumes on another layout and continues the uninterrupted run (issue 27).

The checkpoint's resume format is DCP (glmstack/train/resharding.py): model, Muon momentum and AdamW moments are
saved per rank with their global shapes and re-cut for the new layout. Each resume first re-saves step 2 without
training (the weights after loading, gathered: they must equal the saved ones bit for bit), then trains steps 3-4.

Tolerance for the losses, 5e-5 relative: every layout computes the same fp32 math but sums in another order
(FSDP2's reduce-scatter, DDP's all-reduce, one process's accumulation, EP's all-to-all dispatch and combine), and
Newton–Schulz runs in fp32 here (optim.ns_dtype=float32) so bf16 rounding cannot amplify that. Measured at
steps 3-4: one process 0.0, DDP 0.0, EP 2 + FSDP2 0.0 (5.1e-6 while EP computed the dispatched tokens' experts
with other kernels than the model's own path, grown by one Muon step). What the bound must catch: resuming with the optimizer state lost (weights and data right) moves the
step-4 loss by 5.0e-4 relative; a wrong data position changes the batch and so the step-3 loss by far more. 5e-5
is 10x above the noise and 10x below the smallest error.

Data: the synthetic stream's batch g (global index) is a pure function of g; the position is saved in global
batches, so the resumed run must continue at the same global batch on any number of ranks: the rank files of
steps 2 and 4 say 4 and 8 global batches, and the losses (a function of the data) match.
"""

import json
import os
import shutil

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file
from tiny_runs import TINY, free_port

from glmstack.recipes import load_config
from glmstack.train.stage import run

pytestmark = [pytest.mark.dist, pytest.mark.slow]
STEPS = 4
BASE = TINY + [f"steps={STEPS}", "ckpt.every=2", "ckpt.keep_last=3", "optim.ns_dtype=float32"]
TOL = 5e-5


def _worker(rank, world, port, overrides, resave_first):
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank)
    )
    torch.set_num_threads(1)
    _run(overrides, resave_first)
    torch.distributed.destroy_process_group()


def _run(overrides, resave_first):
    cfg = load_config("tiny", "pretrain", overrides)
    if resave_first:
        run(cfg, stop_at=2)  # load step 2 and save it again, untouched
    run(cfg)


def _stage(out):
    return out / "tiny" / "pretrain"


def _rows(out):
    return [json.loads(r) for r in (_stage(out) / "metrics.jsonl").read_text().splitlines()]


def _weights(folder):
    return load_file(str(folder / "model.safetensors"))


def _data_position(folder):
    return torch.load(folder / "trainer_state" / "rank_00000.pt", weights_only=False)["data"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """2 ranks FSDP2, 4 steps straight; keeps its step-2 checkpoint (ckpt.every=2)."""
    out = tmp_path_factory.mktemp("fsdp2")
    mp.spawn(_worker, args=(2, free_port(), BASE + ["dist.dp=fsdp", f"out_dir={out}"], False), nprocs=2, join=True)
    return out


def _resume_from_step2(uninterrupted, tmp_path):
    shutil.copytree(_stage(uninterrupted) / "step_0000002", _stage(tmp_path) / "step_0000002")
    (_stage(tmp_path) / "latest").write_text("step_0000002\n")
    return _weights(_stage(tmp_path) / "step_0000002")


@pytest.mark.parametrize(
    "world,layout",
    [
        (1, ["grad_accum=2"]),  # the same global batch: 2 micro-batches on one rank
        (2, ["dist.dp=ddp"]),
        (2, ["dist.dp=fsdp", "dist.expert_parallel=true"]),  # EP 2 (experts re-cut from the FSDP2 banks)
    ],
    ids=["one-process", "ddp", "ep2-fsdp"],
)
def test_fsdp2_checkpoint_resumes_on_another_layout(uninterrupted, tmp_path, world, layout):
    saved = _resume_from_step2(uninterrupted, tmp_path)
    overrides = BASE + layout + [f"out_dir={tmp_path}"]
    if world == 1:
        _run(overrides, resave_first=True)
    else:
        mp.spawn(_worker, args=(world, free_port(), overrides, True), nprocs=world, join=True)

    # the weights after resume are the saved ones, bit for bit (step 2 re-saved before any training)
    resaved = _weights(_stage(tmp_path) / "step_0000002")
    assert saved.keys() == resaved.keys()
    assert all(torch.equal(saved[k], resaved[k]) for k in saved)

    # data: continued at global batch 4 (2 steps x 2 micro-batches), ended at 8, as the uninterrupted run
    assert _data_position(_stage(tmp_path) / "step_0000002") == {"global_batches": 4}
    assert _data_position(_stage(tmp_path) / "step_0000004") == _data_position(_stage(uninterrupted) / "step_0000004")

    # the next steps' losses are the uninterrupted run's
    want = {r["step"]: r["loss"] for r in _rows(uninterrupted)}
    got = {r["step"]: r["loss"] for r in _rows(tmp_path)}
    assert sorted(got) == [3, 4]
    worst = max(abs(got[s] - want[s]) / abs(want[s]) for s in got)
    print(f"{world} rank(s) {layout}: max relative loss difference after resume {worst:.2e}")
    assert worst <= TOL, (got, want)
