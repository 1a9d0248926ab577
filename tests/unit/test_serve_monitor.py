"""The speculative-acceptance monitor: its statistics and rules, and the scheduler flagging / aborting on them."""

from __future__ import annotations

import threading

import pytest

from glmstack.inference import Engine
from glmstack.inference.prefix_cache import PrefixCache
from glmstack.inference.sampling import SamplingParams
from glmstack.model import GLM, ModelConfig
from glmstack.serve.monitor import AcceptanceMonitor, MonitorConfig
from glmstack.serve.scheduler import Job, Scheduler, Token


def _run(steps, cfg=None, k=2):
    mon = AcceptanceMonitor(cfg or MonitorConfig(), k)
    hits = [mon.step(n) for n in steps]
    return mon, [h for h in hits if h]


def test_statistics():
    mon, _ = _run([3, 1, 2, 2])
    assert mon.length == 2.0 and mon.rate == pytest.approx(4 / 8)
    assert mon.report() == {"verify_steps": 4, "acceptance_length": 2.0, "acceptance_rate": 0.5, "anomaly": None}


def test_rules_fire_only_past_min_tokens_and_once():
    assert _run([1] * 128)[1] == []  # 128 tokens at length 1: not yet more than min_tokens
    mon, hits = _run([1] * 200)
    assert hits == ["corrupted-context"] and mon.anomaly == "corrupted-context"
    assert _run([3] * 60)[1] == ["degenerate-repetition"]  # every draft accepted: rate 1 > 0.96
    assert _run([2] * 100)[1] == []  # length 2, rate 0.5: healthy
    assert _run([1, 2] * 100)[1] == []  # length 1.5 > 1.4


def test_thresholds_are_settings():
    cfg = MonitorConfig(min_acceptance_length=1.6, max_acceptance_rate=0.99, min_tokens=10)
    assert _run([1, 2] * 20, cfg)[1] == ["corrupted-context"]
    assert _run([3] * 20, cfg)[1] == ["degenerate-repetition"]
    assert _run([1] * 50, MonitorConfig(action="off"))[1] == []
    with pytest.raises(ValueError, match="monitor action"):
        MonitorConfig(action="explode")


@pytest.mark.parametrize("action", ["flag", "abort"])
def test_scheduler_flags_or_aborts(action):
    """A random MTP layer never drafts right (length 1.0 < 1.4): flagged after min_tokens, and with "abort" the
    request ends there; the tokens it did emit are the no-cache greedy output's first ones."""
    model = GLM(ModelConfig.preset("tiny", max_position_embeddings=256)).init_weights(seed=0).eval()
    engine = Engine(model)
    sched = Scheduler(engine, speculative="mtp", draft_k=2, prefix_cache=PrefixCache(8, 2**22),
                      monitor=MonitorConfig(min_tokens=8, action=action))  # fmt: skip
    got, fin, done = [], [], threading.Event()
    emit = lambda ev: got.append(ev.id) if isinstance(ev, Token) else (fin.append(ev), done.set())
    prompt = list(range(3, 40))
    sched.start()
    try:
        sched.submit(
            [Job(prompt_ids=prompt, max_new_tokens=30, params=SamplingParams(temperature=0), seed=0, emit=emit)]
        )
        assert done.wait(120)
    finally:
        sched.stop()
    ref = engine.generate([prompt], 30, stop_ids=[]).tokens[0]
    assert sched.stats["anomalies"]["corrupted-context"] == 1
    if action == "abort":
        assert fin[0].reason == "abort" and "corrupted-context" in fin[0].message and 8 < len(got) < 30
    else:
        assert fin[0].reason == "length" and len(got) == 30
    assert got == ref[: len(got)]
