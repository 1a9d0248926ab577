"""Continuous batching (glmstack.serve.scheduler): requests that join and leave a running batch get exactly what
Engine.generate gives each of them alone — greedy and seeded sampling, across cache re-batching and reclaiming."""

import threading
import time

import torch

from glmstack.inference import Engine
from glmstack.inference.sampling import SamplingParams
from glmstack.model import GLM, ModelConfig
from glmstack.serve.scheduler import Finished, Job, Scheduler, Token


def _collect(outs, i, done):
    def emit(ev):
        outs[i].append(ev.id if isinstance(ev, Token) else ev)
        if isinstance(ev, Finished):
            done.release()

    return emit


def test_joining_and_leaving_rows_equal_generate_alone():
    # a short context makes the running cache reach its end, so drop_front runs too
    model = GLM(ModelConfig.preset("tiny", max_position_embeddings=12)).init_weights(seed=0)
    engine = Engine(model)
    sched = Scheduler(engine, max_running=2, max_waiting=16)
    g = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(0, 500, (n,), generator=g).tolist() for n in (5, 9, 3, 2, 7, 4, 6, 3, 5, 2, 8, 3, 6, 2, 4, 7)
    ]
    outs, done = {i: [] for i in range(len(prompts))}, threading.Semaphore(0)
    settings = [(0.0 if i % 2 == 0 else 1.0, 12 - len(p)) for i, p in enumerate(prompts)]
    sched.start()
    try:
        for i, p in enumerate(prompts):  # 2 run at once; the others join as rows leave
            temp, budget = settings[i]
            sched.submit([Job(prompt_ids=p, max_new_tokens=budget, params=SamplingParams(temperature=temp, top_p=0.9),
                              seed=10 + i, emit=_collect(outs, i, done))])  # fmt: skip
        for _ in prompts:
            assert done.acquire(timeout=120)
    finally:
        sched.stop()
    for i, p in enumerate(prompts):
        temp, budget = settings[i]
        ref = engine.generate([p], budget, temperature=temp, top_p=0.9, seeds=[10 + i], stop_ids=[])
        assert outs[i][:-1] == ref.tokens[0], i
        assert outs[i][-1].reason == "length"
    assert sched.stats["generated_tokens"] == sum(b for _, b in settings)
    assert sched.stats["reclaimed"] > 0  # the cache's front was reclaimed at least once


def test_cancel_and_deadline_abort_between_steps():
    engine = Engine(GLM(ModelConfig.preset("tiny")).init_weights(seed=0))
    sched = Scheduler(engine, max_running=4)
    outs, done = {0: [], 1: []}, threading.Semaphore(0)
    jobs = [Job(prompt_ids=[1, 2, 3], max_new_tokens=2000, params=SamplingParams(temperature=0), seed=0,
                emit=_collect(outs, i, done)) for i in range(2)]  # fmt: skip
    jobs[1].deadline = time.monotonic() + 0.3
    sched.start()
    try:
        sched.submit(jobs)
        while len(outs[0]) < 3:
            time.sleep(0.01)
        jobs[0].cancelled = True
        assert done.acquire(timeout=60) and done.acquire(timeout=60)
    finally:
        sched.stop()
    assert [outs[i][-1].reason for i in (0, 1)] == ["abort", "abort"]
    assert "time limit" in outs[1][-1].message and len(outs[1]) < 2000


def test_speculative_mode_runs_one_at_a_time_and_matches_greedy():
    """--speculative mtp: jobs run one by one through Engine.stream(speculative="mtp"): greedy output unchanged."""
    engine = Engine(GLM(ModelConfig.preset("tiny")).init_weights(seed=0))
    sched = Scheduler(engine, speculative="mtp", draft_k=2)
    outs, done = {0: [], 1: []}, threading.Semaphore(0)
    prompts = [[3, 1, 4, 1, 5], [9, 2, 6]]
    sched.start()
    try:
        sched.submit([Job(prompt_ids=p, max_new_tokens=9, params=SamplingParams(temperature=0), seed=0,
                          emit=_collect(outs, i, done)) for i, p in enumerate(prompts)])  # fmt: skip
        assert done.acquire(timeout=60) and done.acquire(timeout=60)
    finally:
        sched.stop()
    for i, p in enumerate(prompts):
        assert outs[i][:-1] == engine.generate([p], 9, temperature=0, stop_ids=[]).tokens[0]
        assert outs[i][-1].reason == "length"
