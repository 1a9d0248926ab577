"""Vision-language stages over 2 gloo ranks (issue 35: VL models flow through the same stages, DDP included): the
sft stage and vl-rl with `micro_batch_size × grad_accum × ranks` as the global batch give the single process's
losses and weights with the same global batch.

The sft stage starts from the recipe's preset (no init_from: a tokenizer trained on the synthetic set's texts, the
same on every rank; rank 0 writes the shared files); vl-rl then starts from the single run's exported model.
"""

import json
import os

import pytest
import torch.multiprocessing as mp
from tiny_runs import free_port

from glmstack.cli import main as glmstack

pytestmark = pytest.mark.dist
SFT = ["--stage", "sft", "--set", "init_from=", "--set", "steps=2", "--set", "vl.synthetic_n=32", "--set",
       "vl.eval_n=2", "--set", "log.progress=false", "--set", "log.plots=false", "--set", "seq_len=192",
       "--set", "vl.stream=false", "--set", "optim.ns_dtype=float32"]  # fmt: skip


def _worker(rank, world, port, args):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))  # fmt: skip
    import torch

    torch.set_num_threads(1)
    assert glmstack(args) == 0
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def _rows(out, stage):
    return [json.loads(x) for x in (out / "vl_tiny" / stage / "metrics.jsonl").read_text().splitlines()]


def _two(out, args):
    mp.spawn(_worker, args=(2, free_port(), [*args, "--set", f"out_dir={out}"]), nprocs=2, join=True)


def _close(got, ref, keys=("loss", "grad_norm")):
    assert [r["step"] for r in got] == [r["step"] for r in ref]
    for a, b in zip(got, ref):
        for k in keys:
            assert abs(a[k] - b[k]) <= 1e-5 * max(1.0, abs(b[k])), (k, got, ref)


def test_vl_sft_and_rl_two_ranks_equal_one_process(tmp_path):
    single, two = tmp_path / "single", tmp_path / "two"
    base = ["vl-train", "vl_tiny", *SFT, "--set", "micro_batch_size=2"]
    assert glmstack([*base, "--set", "grad_accum=2", "--set", f"out_dir={single}"]) == 0
    _two(two, [*base, "--set", "grad_accum=1"])
    _close(_rows(two, "sft"), _rows(single, "sft"))
    assert (two / "vl_tiny" / "sft" / "model" / "preprocessor_config.json").is_file()  # rank 0 exported

    model = single / "vl_tiny" / "sft" / "model"
    rl = ["rl", "vl_tiny", "--set", f"init_from={model}", "--set", "steps=2", "--set", "rl.samples_per_step=8",
          "--set", "rl.curriculum=[[0, 0, 4]]", "--set", "rl.max_new_tokens=4", "--set", "rl.heldout_n=2", "--set",
          "rl.eval_every=0", "--set", "vl.eval_n=0", "--set", "log.plots=false", "--set", "log.progress=false",
          "--set", "rl.entropy_coef=0.05", "--set", "micro_batch_size=4", "--set", "optim.ns_dtype=float32"]  # fmt: skip
    assert glmstack([*rl, "--set", "grad_accum=2", "--set", f"out_dir={single}"]) == 0
    _two(two, [*rl, "--set", "grad_accum=1"])
    ref, got = _rows(single, "rl"), _rows(two, "rl")
    _close(got, ref)
    assert [r["reward"] for r in got] == [r["reward"] for r in ref] and ref[-1]["grad_norm"] > 0


def test_vl_refuses_what_ranks_cannot_do(tmp_path):
    """The vit stage and FSDP2 are refused under torchrun with one line (exit 2), not run as N copies."""
    out = tmp_path / "x"
    for extra in (["--stage", "vit"], ["--stage", "sft", "--set", "dist.dp=fsdp"]):
        mp.spawn(_refused, args=(2, free_port(), ["vl-train", "vl_tiny", *extra, "--set", f"out_dir={out}"]),
                 nprocs=2, join=True)  # fmt: skip


def _refused(rank, world, port, args):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))  # fmt: skip
    assert glmstack(args) == 2
