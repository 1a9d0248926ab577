"""Resume is exact: N steps, stop, resume N more == 2N uninterrupted, bit for bit on CPU; bad resumes are refused."""

import json

import pytest
import torch
from safetensors.torch import load_file

from glmstack.config import ConfigError
from glmstack.recipes import load_config
from glmstack.train import checkpoint
from glmstack.train.stage import run

FAST = [
    "seq_len=32",
    "micro_batch_size=2",
    "grad_accum=2",
    "schedule.warmup_steps=2",
    "log.progress=false",
    "log.plots=false",
    "ckpt.every=0",
    "log.val_every=0",
    "schedule.batch_warmup_tokens=192",  # accum 1, 1, 2, 2, ...: the ramp crosses the resume
    "schedule.batch_warmup_start_tokens=64",
    "schedule.mtp_weight=[[0, 0.3], [3, 0.1]]",
]


def _cfg(tmp_path, name, *extra):
    return load_config("tiny", "pretrain", FAST + [f"out_dir={tmp_path}", f"run={name}", "steps=6", *extra])


def _weights(tmp_path, name):
    folder = checkpoint.latest(tmp_path / name / "pretrain")
    return {k: v for f in sorted(folder.glob("*.safetensors")) for k, v in load_file(str(f)).items()}


def _losses(tmp_path, name):
    rows = [json.loads(line) for line in (tmp_path / name / "pretrain" / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in rows]


def test_resume_is_bit_exact(tmp_path):
    run(_cfg(tmp_path, "straight"))
    first = run(_cfg(tmp_path, "resumed"), stop_at=3)
    assert first["step"] == 3
    run(_cfg(tmp_path, "resumed"))
    a, b = _weights(tmp_path, "straight"), _weights(tmp_path, "resumed")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert _losses(tmp_path, "straight") == _losses(tmp_path, "resumed")
    state = torch.load(
        checkpoint.latest(tmp_path / "resumed" / "pretrain") / "trainer_state" / "state.pt", weights_only=False
    )
    assert state["loop"]["step"] == 6 and any(b.abs().sum() > 0 for b in state["balance_biases"])


def test_resume_with_incompatible_config_names_fields(tmp_path):
    run(_cfg(tmp_path, "r", "steps=2"))
    with pytest.raises(ConfigError, match=r"optim\.lr.*seq_len|seq_len.*optim\.lr"):
        run(_cfg(tmp_path, "r", "steps=4", "optim.lr=0.1", "seq_len=16"))
    run(_cfg(tmp_path, "r", "steps=3"))  # steps may change: continues from 2


def test_keep_last_prunes(tmp_path):
    run(_cfg(tmp_path, "k", "steps=4", "ckpt.every=1", "ckpt.keep_last=2"))
    stage = tmp_path / "k" / "pretrain"
    assert sorted(p.name for p in stage.glob("step_*")) == ["step_0000003", "step_0000004"]
    assert (stage / "latest").read_text().strip() == "step_0000004"
