"""The one loop: NaN/spike guard stops cleanly with a checkpoint, custom loss hook, metrics + plots, balancing."""

import json

import pytest
import torch

from glmstack.recipes import load_config
from glmstack.train import balance, checkpoint
from glmstack.train.loop import pretrain_loss
from glmstack.train.stage import run

FAST = [
    "seq_len=16",
    "micro_batch_size=2",
    "log.progress=false",
    "log.val_every=0",
    "ckpt.every=0",
    "schedule.batch_warmup_tokens=0",
]


def test_nan_guard_skips_then_stops_with_checkpoint(tmp_path):
    calls = {"n": 0}

    def flaky_loss(model, batch, values):  # the loss_fn hook SFT/RL plug into; NaN from the 3rd step on
        calls["n"] += 1
        loss, metrics = pretrain_loss(model, batch, values)
        return (loss * float("nan") if calls["n"] > 2 else loss), metrics

    cfg = load_config(
        "tiny", "pretrain", FAST + [f"out_dir={tmp_path}", "steps=10", "guard.max_bad_steps=3", "log.plots=false"]
    )
    result = run(cfg, loss_fn=flaky_loss)
    assert result["stopped"] == "bad_steps" and result["skipped"] == 3 and result["step"] == 5
    folder = checkpoint.latest(tmp_path / "tiny" / "pretrain")
    assert folder.name == "step_0000005"
    weights = torch.load(folder / "trainer_state" / "state.pt", weights_only=False)
    assert weights["loop"]["bad_in_row"] == 3
    from safetensors.torch import load_file

    assert all(torch.isfinite(t).all() for f in folder.glob("*.safetensors") for t in load_file(str(f)).values())


def test_metrics_rows_and_plots(tmp_path):
    cfg = load_config(
        "tiny", "pretrain", FAST + [f"out_dir={tmp_path}", "steps=3", "log.val_every=3", "log.val_batches=1"]
    )
    result = run(cfg)
    stage = tmp_path / "tiny" / "pretrain"
    rows = [json.loads(line) for line in (stage / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert {"loss", "lr", "grad_norm", "tok_per_s", "lm_loss", "mtp_loss", "aux_loss", "moe/max_over_mean"} <= set(
        rows[0]
    )
    assert "val_loss" in rows[-1] and result["val_loss"] == rows[-1]["val_loss"]
    assert {p.name for p in (stage / "plots").glob("*.png")} >= {"loss.png", "lr.png", "router_load.png"}
    assert json.loads((stage / "config.json").read_text())["steps"] == 3


def test_validation_between_log_steps_is_written(tmp_path):
    """val_every=3 with log.every=4: steps 3 and 6 validate off the log grid and still get their rows."""
    overrides = ["steps=8", "log.every=4", "log.val_every=3", "log.val_batches=1", "log.plots=false"]
    result = run(load_config("tiny", "pretrain", FAST + [f"out_dir={tmp_path}"] + overrides))
    rows = [json.loads(line) for line in (tmp_path / "tiny" / "pretrain" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [3, 4, 6, 8]
    assert [r["step"] for r in rows if "val_loss" in r] == [3, 6, 8]
    assert all("lm_loss" in r for r in rows)  # a full training row, so the loss curves stay step-indexed
    assert result["val_loss"] == rows[-1]["val_loss"]


def test_bias_update_direction():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("e_score_correction_bias", torch.zeros(4))

    m = M()
    load = torch.tensor([[10.0, 2.0, 2.0, 2.0]])  # expert 0 overloaded
    balance.update_biases(m, load, rate=1e-3)
    assert torch.allclose(m.e_score_correction_bias, torch.tensor([-1e-3, 1e-3, 1e-3, 1e-3]))
    metrics = balance.load_metrics(load)
    assert metrics["moe/max_over_mean"] == 2.5
    assert metrics["moe/entropy/0"] < torch.log(torch.tensor(4.0))


def test_spike_guard_rule():
    from glmstack.train.loop import LoopState, _is_bad

    state = LoopState(loss_ema=2.0)
    assert not _is_bad(3.9, 1.0, state, spike_factor=2.0)
    assert _is_bad(4.1, 1.0, state, spike_factor=2.0)
    assert not _is_bad(4.1, 1.0, state, spike_factor=0.0)  # spike check off: only NaN/inf
    assert _is_bad(1.0, float("inf"), state, spike_factor=0.0) and _is_bad(float("nan"), 1.0, state, 0.0)


@pytest.mark.slow
def test_bias_updates_even_out_the_load(tmp_path):
    """The direction of loss-free balancing in a real run (bench/balance.py gives the 300-step figures)."""

    def worst_load(rate):
        out = tmp_path / str(rate)
        cfg = load_config(
            "tiny",
            "pretrain",
            FAST
            + [
                f"out_dir={out}",
                "steps=30",
                "seq_len=32",
                "micro_batch_size=4",
                f"schedule.balance_rate=[[0, {rate}]]",
                "log.plots=false",
            ],
        )
        run(cfg)
        rows = [json.loads(line) for line in (out / "tiny" / "pretrain" / "metrics.jsonl").read_text().splitlines()]
        return sum(r["moe/max_over_mean"] for r in rows[-10:]) / 10

    assert worst_load(1e-2) < worst_load(0.0)
