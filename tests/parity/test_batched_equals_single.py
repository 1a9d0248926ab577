"""Batching changes nothing: greedy output of a left-padded batch (Engine.generate) and of continuous batching (the
server's Scheduler, requests joining a running batch, no prefix cache) equals each prompt generated alone, token for
token, for GQA (tiny), MLA (tiny-glm47-flash) and MLA + DSA (tiny-glm5, decoding past index_topk so it is sparse).

The DSA case is the regression test of issue 24's mismatch: the indexer's top-k broke exact score ties (frequent in
random tiny indexers: ReLU zeros) by torch.topk's order, which depends on the key axis's length, so a padded or
re-batched row picked other keys than the row alone (4 of these 24 prompts in Engine.generate). dsa.select_topk now
gives ties to the earliest key in every layout.
"""

from __future__ import annotations

import random
import threading

import pytest

from glmstack.inference import Engine
from glmstack.inference.sampling import SamplingParams
from glmstack.model import GLM, ModelConfig
from glmstack.serve.scheduler import Job, Scheduler, Token

N_NEW = 16
rng = random.Random(0)
PROMPTS = [[rng.randrange(512) for _ in range(rng.randrange(1, 30))] for _ in range(24)]


@pytest.fixture(scope="module", params=["tiny", "tiny-glm47-flash", "tiny-glm5"])
def engine_and_refs(request):
    engine = Engine(GLM(ModelConfig.preset(request.param)).init_weights(seed=0).eval())
    return engine, [engine.generate([p], N_NEW, stop_ids=[]).tokens[0] for p in PROMPTS]


def test_padded_batch_equals_single(engine_and_refs):
    engine, refs = engine_and_refs
    assert engine.generate(PROMPTS, N_NEW, stop_ids=[]).tokens == refs


def test_continuous_batching_equals_single(engine_and_refs):
    engine, refs = engine_and_refs
    sched = Scheduler(engine, max_running=6)
    outs, done = [[] for _ in PROMPTS], threading.Semaphore(0)
    sched.start()
    try:
        for i, p in enumerate(PROMPTS):  # 3 at a time, budgets staggered: rows join and leave a running batch
            emit = lambda ev, i=i: outs[i].append(ev.id) if isinstance(ev, Token) else done.release()
            sched.submit([Job(prompt_ids=p, max_new_tokens=N_NEW - i % 4, params=SamplingParams(temperature=0),
                              seed=0, emit=emit)])
            if i % 3 == 2:
                assert done.acquire(timeout=60)
        for _ in range(len(PROMPTS) - len(PROMPTS) // 3):
            assert done.acquire(timeout=60)
    finally:
        sched.stop()
    assert outs == [r[: N_NEW - i % 4] for i, r in enumerate(refs)]
