"""Prefix cache: block matching, reference counts, LRU eviction of unpinned leaves under the budget, and the
scheduler's outputs with the cache equal to single-request generation without it (GQA and MLA, temperature 0)."""

from __future__ import annotations

import random
import threading
from itertools import pairwise

import pytest
import torch

from glmstack.inference import Engine
from glmstack.inference.prefix_cache import PrefixCache
from glmstack.inference.sampling import SamplingParams
from glmstack.model import GLM, ModelConfig
from glmstack.serve.scheduler import Job, Scheduler, Token

BS = 4


def _kv(j):
    """A block's per-layer (k, v): layer 0, (H=1, BS, Dh=2), tagged with the block index; 64 bytes."""
    return {0: (torch.full((1, BS, 2), float(j)), torch.full((1, BS, 2), float(j)))}, None


def _insert(pc, ids):
    return pc.insert(ids, pc.match(ids + [0]), _kv)


def test_match_longest_chain_and_last_token_always_computed():
    pc = PrefixCache(block_size=BS, budget_bytes=10_000)
    ids = list(range(10))  # two full blocks
    chain = _insert(pc, ids)
    assert len(chain) == 2 and len(pc.blocks) == 2
    assert len(pc.match(ids)) == 2  # 10 tokens: both blocks, tokens 8 and 9 computed
    assert len(pc.match(ids[:8])) == 1  # 8 tokens: the second block would leave nothing to compute
    assert len(pc.match(ids[:4] + [99] * 6)) == 1  # diverges in block 1
    assert pc.match([99] + ids[1:]) == []  # diverges in block 0: nothing
    assert pc.match(ids)[1].kv[0][0][0, 0, 0] == 1.0


def test_same_tokens_under_other_parent_are_another_block():
    pc = PrefixCache(block_size=BS, budget_bytes=10_000)
    _insert(pc, [1, 2, 3, 4, 5, 6, 7, 8])
    _insert(pc, [9, 9, 9, 9, 5, 6, 7, 8])
    assert len(pc.blocks) == 4
    a, b = pc.match([1, 2, 3, 4, 5, 6, 7, 8, 0]), pc.match([9, 9, 9, 9, 5, 6, 7, 8, 0])
    assert a[1] is not b[1] and a[1].parent is a[0] and b[1].parent is b[0]


def test_eviction_lru_leaves_first_and_pins_hold():
    pc = PrefixCache(block_size=BS, budget_bytes=3 * 64)  # room for 3 blocks
    chain_a = _insert(pc, [1] * 8)  # a0 <- a1
    pc.acquire(chain_a)  # a running request pins its chain
    _insert(pc, [2] * 4)  # b0: cache full
    _insert(pc, [3] * 4)  # needs room: a is pinned, b0 is the only unpinned leaf
    assert pc.stats["evicted"] == 1 and pc.match([2] * 5) == [] and len(pc.match([3] * 5)) == 1
    assert pc.bytes <= pc.budget_bytes
    _insert(pc, [4] * 4)  # nothing evictable but c0
    assert pc.match([3] * 5) == [] and len(pc.match([1] * 9)) == 2
    pc.release(chain_a)
    # unpinned now: the leaf a1 goes before its parent a0 though a0 was touched no later
    pc.match([4] * 5)
    _insert(pc, [5] * 4)
    assert len(pc.match([1] * 9)) == 1 and pc.bytes <= pc.budget_bytes


def test_everything_pinned_skips_insertion():
    pc = PrefixCache(block_size=BS, budget_bytes=2 * 64)
    chain = _insert(pc, [1] * 8)
    pc.acquire(chain)
    assert _insert(pc, [2] * 4) == [] and pc.stats["skipped"] == 1 and len(pc.blocks) == 2
    with pytest.raises(RuntimeError, match="not pinned"):
        pc.release(chain + chain)  # one pin each: the second release of each block is an error


def test_fault_block_corrupts_exactly_one_block():
    pc = PrefixCache(block_size=BS, budget_bytes=10_000, fault_block=1)
    _insert(pc, list(range(12)))
    k = [b.kv[0][0] for b in pc.match(list(range(13)))]
    assert (k[0] == 0).all() and (k[2] == 2).all() and not (k[1] == 1).all() and pc.corrupted is not None


def test_swap_fault_gives_a_block_another_requests_kv():
    """fault_mode "swap" (Z.ai's race: a request reads a block another request wrote): block 5 (the second of the
    second prompt) holds a copy of the first prompt's block at the same depth, 1; the rest is untouched."""
    pc = PrefixCache(block_size=BS, budget_bytes=10_000, fault_block=5, fault_mode="swap")
    _insert(pc, [1] * 16)  # blocks 0..3 tagged 0..3
    pc.insert([2] * 16, [], lambda j: _kv(10 + j))  # blocks 4..7 tagged 10..13; block 5 gets block 1's KV
    k = [b.kv[0][0][0, 0, 0].item() for b in pc.match([2] * 17)]
    assert k == [10.0, 1.0, 12.0, 13.0] and pc.corrupted is pc.match([2] * 17)[1]
    with pytest.raises(RuntimeError, match="another request"):
        _insert(PrefixCache(block_size=BS, budget_bytes=10_000, fault_block=1, fault_mode="swap"), [1] * 8)
    with pytest.raises(ValueError, match="fault_mode"):
        PrefixCache(fault_mode="zero")


def _served_equals_generate(preset: str, n: int = 12) -> tuple[int, dict]:
    cfg = ModelConfig.preset(preset, max_position_embeddings=256)
    engine = Engine(GLM(cfg).init_weights(seed=0).eval())
    pc = PrefixCache(block_size=8, budget_bytes=40 * 8 * 1024)  # small: evictions happen
    sched = Scheduler(engine, max_running=4, prefix_cache=pc)
    rng = random.Random(0)
    base = [rng.randrange(1, 500) for _ in range(40)]
    prompts = [base[: rng.randrange(4, 40)] + [rng.randrange(1, 500) for _ in range(rng.randrange(1, 12))]
               for _ in range(n)]  # fmt: skip
    outs, done = [[] for _ in prompts], threading.Semaphore(0)
    sched.start()
    try:
        for i, p in enumerate(prompts):
            emit = lambda ev, i=i: outs[i].append(ev.id) if isinstance(ev, Token) else done.release()
            sched.submit([Job(prompt_ids=p, max_new_tokens=6, params=SamplingParams(temperature=0), seed=0, emit=emit)])
            if i % 3 == 2:
                for _ in range(3):
                    assert done.acquire(timeout=60)
        for _ in range(n % 3):
            assert done.acquire(timeout=60)
    finally:
        sched.stop()
    refs = [engine.generate([p], 6, temperature=0, stop_ids=[]).tokens[0] for p in prompts]
    assert outs == refs
    assert all(b.ref == 0 for b in pc.blocks.values())  # every finished request released its pins
    return sched.stats["prefill_computed"], sched.stats


@pytest.mark.parametrize("preset", ["tiny", "tiny-glm47-flash", "tiny-glm5"])
def test_scheduler_with_prefix_cache_equals_no_cache_generate(preset):
    computed, stats = _served_equals_generate(preset)
    assert computed < stats["prompt_tokens"]  # the cache did serve part of the prompts


def test_speculative_path_reuses_the_prefix_mla():
    """--speculative mtp over the cache on an MLA model (latent cache + MTP catch-up from cached hidden states)."""
    engine = Engine(GLM(ModelConfig.preset("tiny-glm47-flash", max_position_embeddings=256)).init_weights(seed=0))
    sched = Scheduler(engine, speculative="mtp", draft_k=2, prefix_cache=PrefixCache(8, 2**22))
    sched.start()
    results = []
    try:
        for p in (list(range(3, 40)), list(range(3, 40)) + [9, 9, 9]):
            got, done = [], threading.Event()
            emit = lambda ev, got=got, done=done: got.append(ev.id) if isinstance(ev, Token) else done.set()
            job = Job(prompt_ids=p, max_new_tokens=12, params=SamplingParams(temperature=0), seed=0, emit=emit)
            sched.submit([job])
            assert done.wait(120)
            results.append((got == engine.generate([p], 12, stop_ids=[]).tokens[0], job.cached_tokens))
    finally:
        sched.stop()
    assert results == [(True, 0), (True, 32)]


def _run(sched, prompt, n=8):
    got, done = [], threading.Event()
    emit = lambda ev: got.append(ev.id) if isinstance(ev, Token) else done.set()
    job = Job(prompt_ids=prompt, max_new_tokens=n, params=SamplingParams(temperature=0), seed=0, emit=emit)
    sched.submit([job])
    assert done.wait(120)
    return got, job.cached_tokens


@pytest.mark.parametrize("preset", ["tiny", "tiny-glm47-flash", "tiny-glm5"])
@pytest.mark.parametrize("completions", [True, False])
def test_next_turn_reuses_the_cached_completion(preset, completions):
    """A conversation's next turn re-sends prompt + completion: with completions cached (the default) the whole of
    it but the last sampled token (never fed) comes from the cache, in blocks; prompts only: just the prompt's full
    blocks. Either way the greedy output equals single-request, no-cache generation."""
    engine = Engine(GLM(ModelConfig.preset(preset, max_position_embeddings=256)).init_weights(seed=0).eval())
    sched = Scheduler(engine, prefix_cache=PrefixCache(BS, 2**24), cache_completions=completions)
    sched.start()
    try:
        prompt, turns = list(range(3, 22)), []
        for _ in range(3):
            out, cached = _run(sched, prompt)
            turns.append((len(prompt), cached, out == engine.generate([prompt], 8, stop_ids=[]).tokens[0]))
            prompt = prompt + out + [7, 8, 9]
    finally:
        sched.stop()
    assert all(same for *_, same in turns)
    for (p0, _, _), (_, cached, _) in pairwise(turns):
        fed = p0 + 8 - 1 if completions else p0
        assert cached == fed // BS * BS
