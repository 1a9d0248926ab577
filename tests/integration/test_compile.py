"""`compile=on` (torch.compile of each block's forward, the default on GPU) trains like eager: same losses, and
the checkpoint it writes is the usual HF folder (state-dict names untouched by compilation).

On CPU, where it runs here, compilation costs ~10 s for the tiny model; on GPU `compile=auto` turns it on.
Muon's Newton–Schulz runs in fp32 on both sides (optim.ns_dtype=float32, as tests/dist does): in bf16 it turns
the compiled kernels' last-bit differences into visible update differences on some CPUs (4e-4 on an EPYC family
23), which is bf16 rounding, not compilation.
"""

import json

import pytest
import torch
from safetensors.torch import load_file

from glmstack.recipes import load_config
from glmstack.train import checkpoint
from glmstack.train.stage import run

pytestmark = pytest.mark.slow
FAST = [
    "micro_batch_size=2",
    "seq_len=32",
    "steps=3",
    "log.progress=false",
    "log.plots=false",
    "log.val_every=0",
    "schedule.batch_warmup_tokens=0",
    "ckpt.every=3",
    "optim.ns_dtype=float32",
]


def _losses(out):
    return [json.loads(r)["loss"] for r in (out / "tiny" / "pretrain" / "metrics.jsonl").read_text().splitlines()]


def test_compiled_blocks_train_like_eager(tmp_path):
    run(load_config("tiny", "pretrain", FAST + [f"out_dir={tmp_path / 'eager'}", "compile=off"]))
    run(load_config("tiny", "pretrain", FAST + [f"out_dir={tmp_path / 'compiled'}", "compile=on"]))
    eager, compiled = _losses(tmp_path / "eager"), _losses(tmp_path / "compiled")
    assert len(eager) == len(compiled) == 3
    for a, b in zip(eager, compiled):
        assert abs(a - b) <= 1e-5 * abs(a), (eager, compiled)
    folders = [checkpoint.latest(tmp_path / side / "tiny" / "pretrain") for side in ("eager", "compiled")]
    a, b = ({k: v for f in d.glob("*.safetensors") for k, v in load_file(str(f)).items()} for d in folders)
    assert a.keys() == b.keys()
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-4
    assert torch.is_tensor(next(iter(b.values())))
