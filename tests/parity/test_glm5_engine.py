"""GLM-5 (MLA + DSA, one MTP layer shared by 3 depths) through the inference engine: cached decoding (one by one
and batched, on the fast path) equals a full recompute, and MTP speculative decoding (the shared layer drafting
every depth) equals plain greedy decoding.

Prompts plus generation exceed index_topk, so decoding is really sparse. DSA picks each query's top-k keys by
indexer score, and random tiny indexers produce exact-zero (ReLU) scores often; the indexers' default tie order
(earliest key, dsa.select_topk) does not depend on shapes, so a left-padded row or a speculative verify block picks
the same keys as the row alone (torch.topk's order would not: see test_batched_equals_single.py).
"""

import functools

import pytest
import torch

from glmstack.inference import Engine
from glmstack.model import GLM, ModelConfig

PROMPTS = [[5, 17, 300, 2, 9, 41, 7, 8, 100, 3], [11], [400, 3, 3, 8]]
N_NEW = 14


@pytest.fixture(scope="module")
def model():
    return GLM(ModelConfig.preset("tiny-glm5", index_topk=6)).init_weights(seed=0).eval()


def greedy_by_recompute(model, prompt, n):
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


def test_cached_decode_equals_full_recompute(model):
    engine = Engine(model)
    assert engine.fast  # MLA: its attention module as it is, the rest on the fast path
    ref = [greedy_by_recompute(model, p, N_NEW) for p in PROMPTS]
    assert engine.generate(PROMPTS, N_NEW, stop_ids=[]).tokens == ref
    assert [engine.generate([p], N_NEW, stop_ids=[]).tokens[0] for p in PROMPTS] == ref  # unpadded, one by one
    # the random MTP layer's drafts (mostly rejected) through the fast path's verify blocks
    assert engine.generate(PROMPTS, N_NEW, stop_ids=[], speculative="mtp", draft_k=2).tokens == ref


def test_absorbed_decode_equals_plain_decode(model):
    plain = Engine(model).generate(PROMPTS, N_NEW, stop_ids=[]).tokens
    for attn in model.attentions():
        attn.absorb = False
    try:
        assert Engine(model).generate(PROMPTS, N_NEW, stop_ids=[]).tokens == plain
    finally:
        for attn in model.attentions():
            attn.absorb = True


@pytest.mark.parametrize("k", [1, 3])
def test_shared_mtp_speculative_equals_greedy(model, k, monkeypatch):
    assert len(model.mtp) == 1 and model.cfg.mtp_depths == 3
    engine = Engine(model, fast=False)  # the oracle below replaces GLM.mtp_step, which the reference path calls
    plain = engine.generate(PROMPTS, N_NEW, stop_ids=[]).tokens
    # random MTP drafts are almost always rejected; an oracle that drafts the true token 70% of the time makes
    # every row accept a different number of drafts, exercising accept and per-row rollback of the MLA cache
    truth = [p + t for p, t in zip(PROMPTS, plain)]
    g = torch.Generator().manual_seed(0)
    calls = []

    def oracle(real, depth, next_ids, hidden, position_ids, cache=None):
        calls.append(depth)
        h, logits = real(depth, next_ids, hidden, position_ids, cache)
        fake = torch.zeros_like(logits)
        for b in range(logits.shape[0]):
            for t in range(logits.shape[1]):
                p = int(position_ids[b, t]) + 2
                tok = truth[b][p] if p < len(truth[b]) else 0
                fake[b, t, tok if torch.rand((), generator=g) < 0.7 else (tok + 1) % logits.shape[-1]] = 10.0
        return h, fake

    monkeypatch.setattr(model, "mtp_step", functools.partial(oracle, model.mtp_step))
    spec = engine.generate(PROMPTS, N_NEW, stop_ids=[], speculative="mtp", draft_k=k)
    assert spec.tokens == plain
    assert set(calls) == {0}  # every depth ran the one shared MTP layer
    assert spec.stats["mean_accepted_length"] > 1.3
