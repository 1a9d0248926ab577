"""Schedules are pure functions of the step: warm-up + cosine to 10%, WSD, batch warm-up, tables."""

import pytest

from glmstack.optim.schedules import accum_steps, batch_tokens, lr_multiplier, piecewise, values_at
from glmstack.train.config import ScheduleConfig


def test_cosine_glm45_endpoints():
    kw = {"kind": "cosine", "warmup_steps": 10, "total_steps": 110, "final_frac": 0.1}
    assert lr_multiplier(0, **kw) == pytest.approx(0.1)
    assert lr_multiplier(9, **kw) == pytest.approx(1.0)
    assert lr_multiplier(10, **kw) == pytest.approx(1.0)
    assert lr_multiplier(60, **kw) == pytest.approx(0.55)
    assert 2.5e-4 * lr_multiplier(110, **kw) == pytest.approx(2.5e-5)  # GLM-4.5: 2.5e-4 -> 2.5e-5
    assert lr_multiplier(500, **kw) == pytest.approx(0.1)


def test_wsd():
    kw = {"kind": "wsd", "warmup_steps": 0, "total_steps": 100, "final_frac": 0.0, "wsd_decay_frac": 0.2}
    assert lr_multiplier(50, **kw) == 1.0 and lr_multiplier(80, **kw) == 1.0
    assert lr_multiplier(90, **kw) == pytest.approx(0.5) and lr_multiplier(100, **kw) == pytest.approx(0.0)


def test_tables_and_batch_warmup():
    assert [piecewise([[0, 0.3], [5, 0.1]], s) for s in (0, 4, 5, 9)] == [0.3, 0.3, 0.1, 0.1]
    assert batch_tokens(0, full_tokens=64, start_tokens=16, warmup_tokens=256) == 16
    assert batch_tokens(128, full_tokens=64, start_tokens=16, warmup_tokens=256) == 40
    assert batch_tokens(256, full_tokens=64, start_tokens=16, warmup_tokens=256) == 64
    sched = ScheduleConfig(batch_warmup_start_tokens=100, batch_warmup_tokens=1000)
    assert [accum_steps(t, sched, tokens_per_micro=100, full_accum=4) for t in (0, 500, 1000)] == [1, 2, 4]


def test_values_at_offset_continues_decay():
    sched = ScheduleConfig(
        warmup_steps=0,
        total_steps=200,
        step_offset=100,
        mtp_weight=[[0, 0.3], [100, 0.1]],
        balance_rate=[[0, 1e-3], [150, 0.0]],
    )
    v = values_at(0, sched, stage_steps=100)
    assert v["lr_mult"] == pytest.approx(
        lr_multiplier(100, kind="cosine", warmup_steps=0, total_steps=200, final_frac=0.1)
    )
    assert v["mtp_weight"] == 0.1 and v["balance_rate"] == 1e-3
    assert values_at(60, sched, stage_steps=100)["balance_rate"] == 0.0
