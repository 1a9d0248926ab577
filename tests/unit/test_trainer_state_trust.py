"""Loading is a trust boundary (issue 34): trainer state is read with `torch.load(weights_only=True)`, pickled DCP
state only from the run's own folders, and `init_from` a folder from elsewhere carries no optimizer state unless
`trust_external_state=true` says the folder is trusted like code."""

import shutil

import pytest
import torch

from glmstack.config import ConfigError
from glmstack.errors import CheckpointError
from glmstack.train import checkpoint
from glmstack.recipes import load_config
from glmstack.train.stage import run

FAST = ["micro_batch_size=2", "seq_len=16", "log.progress=false", "log.plots=false", "log.val_every=0",
        "ckpt.every=0", "schedule.batch_warmup_tokens=0"]  # fmt: skip


class Payload:
    def __reduce__(self):  # what a forged checkpoint would do when unpickled
        return (print, ("PAYLOAD RAN",))


def test_trainer_state_reads_as_weights_only_and_forged_files_are_refused(tmp_path, capsys):
    run(load_config("tiny", "pretrain", FAST + [f"out_dir={tmp_path}", "steps=2"]))
    ts = tmp_path / "tiny/pretrain/step_0000002/trainer_state"
    rank = torch.load(ts / "rank_00000.pt", weights_only=True)  # RNG states are lists and tensors
    assert rank["rng"]["torch"].dtype == torch.uint8 and isinstance(rank["rng"]["numpy"][1], list)
    assert torch.load(ts / "state.pt", weights_only=True)["loop"]["step"] == 2
    torch.save({"loop": Payload()}, tmp_path / "forged.pt")
    capsys.readouterr()
    with pytest.raises(CheckpointError, match="beyond tensors and plain values"):
        checkpoint.load_pt(tmp_path / "forged.pt")
    assert "PAYLOAD RAN" not in capsys.readouterr().out


def test_resume_is_exact_with_rng_states_as_plain_values(tmp_path):
    base = FAST + [f"out_dir={tmp_path}", "ckpt.every=1"]
    run(load_config("tiny", "pretrain", base + ["steps=2", "run=a"]))
    run(load_config("tiny", "pretrain", base + ["steps=1", "run=b"]))
    run(load_config("tiny", "pretrain", base + ["steps=2", "run=b"]))  # resumes b's step 1
    a = torch.load(tmp_path / "a/pretrain/step_0000002/trainer_state/rank_00000.pt", weights_only=True)
    b = torch.load(tmp_path / "b/pretrain/step_0000002/trainer_state/rank_00000.pt", weights_only=True)
    assert a["rng"]["numpy"] == b["rng"]["numpy"] and torch.equal(a["rng"]["torch"], b["rng"]["torch"])


def test_init_from_outside_out_dir_carries_optimizer_state_only_when_trusted(tmp_path, capsys):
    run(load_config("tiny", "pretrain", FAST + [f"out_dir={tmp_path / 'theirs'}", "steps=2"]))
    downloaded = tmp_path / "downloaded"
    shutil.copytree(tmp_path / "theirs/tiny/pretrain/step_0000002", downloaded)
    mine = FAST + [f"out_dir={tmp_path / 'mine'}", "steps=1", f"init_from={downloaded}"]
    capsys.readouterr()
    run(load_config("tiny", "midtrain", mine))
    assert "optimizer state: fresh (init_from is outside out_dir" in capsys.readouterr().out
    run(load_config("tiny", "midtrain", mine + ["stage=trusted", "trust_external_state=true"]))
    assert f"optimizer state: carried from {downloaded}" in capsys.readouterr().out


def test_explicit_resume_from_outside_out_dir_is_refused(tmp_path):
    run(load_config("tiny", "pretrain", FAST + [f"out_dir={tmp_path / 'theirs'}", "steps=1", "ckpt.every=1"]))
    step = tmp_path / "theirs/tiny/pretrain/step_0000001"
    with pytest.raises(ConfigError, match="outside out_dir"):
        run(load_config("tiny", "pretrain", FAST + [f"out_dir={tmp_path / 'mine'}", "steps=2", f"ckpt.resume={step}"]))
