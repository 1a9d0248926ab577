"""Sampled generation is reproducible per row: row b's tokens depend only on its prompt, its seed and the sampling
options — not on the other rows of its batch, on rows finishing early and being dropped, or on speculative rows
accepting different numbers of drafts. The rule: row b samples with seeds[b], else seed + b (sampling.row_seeds).
"""

import pytest
import torch

from glmstack.inference import Engine
from glmstack.model import GLM, ModelConfig

PROMPTS = [[5, 17, 300, 2, 9, 41, 7], [11], [400, 3, 3, 8], [7, 7, 7], [300]]
SEEDS = [10, 11, 12, 13, 14]
N_NEW = 24
SAMPLING = {"temperature": 0.9, "top_p": 0.95}  # the random MTP layer then accepts ~2/3 of its drafts
MODES = [{}, {"speculative": "mtp", "draft_k": 3}, {"speculative": "mtp", "draft_k": 1}]


@pytest.fixture(scope="module")
def engine():
    return Engine(GLM(ModelConfig.preset("tiny", num_nextn_predict_layers=1)).init_weights(seed=0).eval())


def one_by_one(engine, prompts, seeds, **kw):
    return [engine.generate([p], N_NEW, seeds=[s], **kw).tokens[0] for p, s in zip(prompts, seeds, strict=True)]


@pytest.mark.parametrize("mode", MODES)
def test_batched_equals_one_by_one(engine, mode):
    res = engine.generate(PROMPTS, N_NEW, seeds=SEEDS, stop_ids=[], **SAMPLING, **mode)
    assert res.tokens == one_by_one(engine, PROMPTS, SEEDS, stop_ids=[], **SAMPLING, **mode)
    assert res.seeds == SEEDS
    if mode:
        hits = res.stats["acceptance_per_depth"]  # drafts accepted (at every depth) and rejected
        assert 0 < hits[-1] and hits[0] < 1


@pytest.mark.parametrize("mode", MODES)
def test_seed_gives_row_b_seed_plus_b(engine, mode):
    res = engine.generate(PROMPTS, N_NEW, seed=7, stop_ids=[], **SAMPLING, **mode)
    assert res.seeds == [7 + b for b in range(len(PROMPTS))]
    assert res.tokens[2] == engine.generate([PROMPTS[2]], N_NEW, seed=9, stop_ids=[], **SAMPLING, **mode).tokens[0]


@pytest.mark.parametrize("mode", MODES)
def test_same_seed_same_output_other_seed_differs(engine, mode):
    a = engine.generate(PROMPTS, N_NEW, seed=3, stop_ids=[], **SAMPLING, **mode).tokens
    assert a == engine.generate(PROMPTS, N_NEW, seed=3, stop_ids=[], **SAMPLING, **mode).tokens
    b = engine.generate(PROMPTS, N_NEW, seed=4, stop_ids=[], **SAMPLING, **mode).tokens
    assert all(x != y for x, y in zip(a, b))
    assert a[0] != engine.generate([PROMPTS[0]] * 2, N_NEW, seed=3, stop_ids=[], **SAMPLING, **mode).tokens[1]


@pytest.mark.parametrize("mode", MODES)
def test_rows_finishing_early_change_nothing(engine, mode):
    """A stop id hit early by some rows: plain decoding drops them (compaction), speculative keeps them riding."""
    free = engine.generate(PROMPTS, N_NEW, seeds=SEEDS, stop_ids=[], **SAMPLING, **mode).tokens
    stop = free[0][2]  # row 0 stops at its 3rd token, the others wherever that id shows up, if at all
    ref = one_by_one(engine, PROMPTS, SEEDS, stop_ids=[stop], **SAMPLING, **mode)
    assert ref[0] == free[0][:3]
    res = engine.generate(PROMPTS, N_NEW, seeds=SEEDS, stop_ids=[stop], **SAMPLING, **mode)
    assert res.tokens == ref
    if not mode:
        assert res.stats["compactions"] >= 1
        engine.compact = False
        try:
            assert engine.generate(PROMPTS, N_NEW, seeds=SEEDS, stop_ids=[stop], **SAMPLING).tokens == ref
        finally:
            engine.compact = True


def test_row_order_does_not_matter(engine):
    order = [3, 0, 4, 1, 2]
    a = engine.generate(PROMPTS, N_NEW, seeds=SEEDS, stop_ids=[], **SAMPLING).tokens
    b = engine.generate([PROMPTS[i] for i in order], N_NEW, seeds=[SEEDS[i] for i in order], stop_ids=[], **SAMPLING)
    assert b.tokens == [a[i] for i in order]


def test_stream_equals_generate_when_sampling(engine):
    streamed = [t for d in engine.stream(PROMPTS[0], N_NEW, seed=5, stop_ids=[], **SAMPLING) for t in d.ids]
    assert streamed == engine.generate([PROMPTS[0]], N_NEW, seeds=[5], stop_ids=[], **SAMPLING).tokens[0]


def test_global_rng_untouched(engine):
    """Greedy draws nothing; sampling draws from the row streams only (torch's global RNG stays where it was)."""
    state = torch.get_rng_state()
    engine.generate(PROMPTS, 4, stop_ids=[])
    engine.generate(PROMPTS, 4, stop_ids=[], **SAMPLING)  # no seed: a random base seed, still not from torch
    engine.generate(PROMPTS, 4, seed=1, stop_ids=[], speculative="mtp", **SAMPLING)
    assert torch.equal(state, torch.get_rng_state())


def test_no_seed_reports_the_seeds_used(engine):
    res = engine.generate(PROMPTS[:2], N_NEW, stop_ids=[], **SAMPLING)
    assert res.seeds[1] == res.seeds[0] + 1
    assert res.tokens[1] == engine.generate([PROMPTS[1]], N_NEW, seeds=res.seeds[1:], stop_ids=[], **SAMPLING).tokens[0]


def test_bad_seeds_raise(engine):
    with pytest.raises(ValueError, match="not both"):
        engine.generate(PROMPTS[:2], 2, seed=1, seeds=[1, 2], **SAMPLING)
    with pytest.raises(ValueError, match="one per prompt"):
        engine.generate(PROMPTS[:2], 2, seeds=[1], **SAMPLING)
