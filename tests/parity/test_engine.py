"""Engine == naive full-recompute decoding, token for token; batched == one by one; stops; bad input errors."""

import pytest
import torch

from glmstack.inference import Engine
from glmstack.inference.kv_cache import KVCache
from glmstack.inference.sampling import RowStreams, SamplingParams, sample
from glmstack.model import GLM, ModelConfig, SimpleKVCache

PROMPTS = [[5, 17, 300, 2, 9, 41, 7], [11], [400, 3, 3, 8]]


@pytest.fixture(scope="module")
def model():
    return GLM(ModelConfig.preset("tiny")).init_weights(seed=0).eval()


@torch.inference_mode()
def naive(model, prompt, n, params=None, seed=None):
    """The plainest loop: the whole sequence through the model at every step, no cache; token t samples with
    draw t of the row's stream."""
    params = params or SamplingParams(temperature=0.0)
    streams = RowStreams([seed]) if seed is not None else None
    ids = list(prompt)
    for t in range(n):
        logits = model(torch.tensor([ids])).logits[:, -1]
        ids.append(int(sample(logits, params, streams and streams.keys(t)[:, 0])[0]))
    return ids[len(prompt) :]


def test_greedy_equals_naive_recompute(model):
    engine = Engine(model)
    for p in PROMPTS:
        assert engine.generate([p], max_new_tokens=12, stop_ids=[]).tokens[0] == naive(model, p, 12)


def test_batched_equals_one_by_one(model):
    engine = Engine(model)
    batched = engine.generate(PROMPTS, max_new_tokens=12, stop_ids=[]).tokens
    assert batched == [engine.generate([p], max_new_tokens=12, stop_ids=[]).tokens[0] for p in PROMPTS]


def test_seeded_sampling_equals_naive_with_same_row_stream(model):
    params = SamplingParams(temperature=0.8, top_p=0.9, top_k=50)
    ref = naive(model, PROMPTS[0], 10, params, seed=4)
    out = Engine(model).generate([PROMPTS[0]], 10, temperature=0.8, top_p=0.9, top_k=50, seed=4, stop_ids=[])
    assert out.tokens[0] == ref


def test_cache_logits_match_reference_cache(model):
    ids = torch.tensor([PROMPTS[0]])
    with torch.inference_mode():
        ref, ours = SimpleKVCache(), KVCache(1, 16)
        for cache in (ref, ours):
            model(ids[:, :4], cache=cache)
        a = model(ids[:, 4:], cache=ref).logits
        b = model(ids[:, 4:], position_ids=torch.arange(4, 7)[None], cache=ours).logits
    torch.testing.assert_close(a, b)


def test_per_row_stop_and_finish_reason(model):
    engine = Engine(model)
    free = engine.generate(PROMPTS, max_new_tokens=6, stop_ids=[]).tokens
    stop = free[0][2]  # row 0 stops at its 3rd token; other rows stop wherever that id appears, if at all
    res = engine.generate(PROMPTS, max_new_tokens=6, stop_ids=[stop])
    assert res.tokens[0] == free[0][:3] and res.finish_reason[0] == "stop"
    for b in (1, 2):
        cut = free[b].index(stop) + 1 if stop in free[b] else 6
        assert res.tokens[b] == free[b][:cut]


def test_stream_yields_same_tokens(model):
    engine = Engine(model)
    streamed = [t for d in engine.stream(PROMPTS[0], max_new_tokens=9, stop_ids=[]) for t in d.ids]
    assert streamed == engine.generate([PROMPTS[0]], max_new_tokens=9, stop_ids=[]).tokens[0]


def test_bad_input_errors():
    small = GLM(ModelConfig.preset("tiny", max_position_embeddings=8)).init_weights(seed=0)
    engine = Engine(small)
    with pytest.raises(ValueError, match="context"):
        engine.generate([list(range(1, 9))], max_new_tokens=4)
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.generate([[1, 2]], max_new_tokens=0)
    with pytest.raises(ValueError, match="empty"):
        engine.generate([[]], max_new_tokens=2)
    with pytest.raises(ValueError, match="tokenizer"):
        engine.generate(["text"], max_new_tokens=2)
    # the context caps the budget: 6 prompt tokens + at most 2 new
    res = engine.generate([list(range(1, 7))], max_new_tokens=10, stop_ids=[])
    assert len(res.tokens[0]) == 2 and res.finish_reason == ["length"]


def test_deferred_host_reads_give_same_tokens(model):
    """sync_every > 1 (the GPU setting): stop ids found late still cut each row at the same place."""
    engine = Engine(model)
    ref = engine.generate(PROMPTS, 10, stop_ids=[])
    stop = ref.tokens[1][3]
    ref = engine.generate(PROMPTS, 10, stop_ids=[stop])
    engine.sync_every = 4
    out = engine.generate(PROMPTS, 10, stop_ids=[stop])
    assert out.tokens == ref.tokens and out.finish_reason == ref.finish_reason


def test_finished_rows_are_dropped_and_the_rest_is_unchanged(model):
    prompts = PROMPTS + [[7, 7, 7], [300]]
    engine = Engine(model)
    free = [engine.generate([p], 12, stop_ids=[]).tokens[0] for p in prompts]
    stop = free[0][1]  # row 0 stops at its 2nd token; others where that id shows up, if ever
    ref = [engine.generate([p], 12, stop_ids=[stop]).tokens[0] for p in prompts]
    out = engine.generate(prompts, 12, stop_ids=[stop])
    assert out.tokens == ref and out.stats["compactions"] >= 1
    engine.compact = False
    assert engine.generate(prompts, 12, stop_ids=[stop]).tokens == ref
