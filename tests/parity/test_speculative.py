"""MTP speculative decoding == plain decoding: greedy token for token, sampling in distribution.

A randomly initialised MTP layer almost never drafts the right token, which would leave the accept/rollback
paths untested. So most tests wrap `model.mtp_step` with an 'oracle' that knows the true greedy continuation and
drafts it, wrong on purpose at a fixed rate: every row then accepts a different number of drafts per step.
"""

import functools
import itertools

import pytest
import torch

from glmstack.inference import Engine, KVCache
from glmstack.inference.fast import FastForward
from glmstack.inference.sampling import SamplingParams, probs
from glmstack.inference.speculative import frequent_tokens
from glmstack.model import GLM, ModelConfig

PROMPTS = [[5, 17, 300, 2, 9, 41, 7], [11], [400, 3, 3, 8]]
N_NEW = 20


@pytest.fixture(scope="module")
def model():
    return GLM(ModelConfig.preset("tiny", num_nextn_predict_layers=2)).init_weights(seed=0).eval()


def oracle(model, prompts, wrong_rate, monkeypatch, fast, seed=0):
    """Patch the MTP draft step: logits that point at the true greedy token at (position + 2), sometimes not."""
    truth = [p + Engine(model).generate([p], N_NEW + 8, stop_ids=[]).tokens[0] for p in prompts]
    g = torch.Generator().manual_seed(seed)

    def fake(real, depth, next_ids, hidden, position_ids, cache=None, last_B=None):
        h, logits = real(depth, next_ids, hidden, position_ids, cache)
        # rows are identified by their first prompt token (all distinct in PROMPTS)
        V = logits.shape[-1]
        fake = torch.zeros_like(logits)
        for b in range(logits.shape[0]):
            seq = truth[b]
            for t in range(logits.shape[1]):
                p = int(position_ids[b, t]) + 2
                tok = seq[p] if p < len(seq) else 0
                rate = wrong_rate[b] if isinstance(wrong_rate, list) else wrong_rate
                if torch.rand((), generator=g) < rate:
                    tok = (tok + 1) % V
                fake[b, t, tok] = 10.0
        if last_B is not None:  # the catch-up asks for one position per row
            rows = torch.arange(h.shape[0])
            return h[rows, last_B], fake[rows, last_B]
        return h, fake

    if fast:
        real = FastForward.mtp_step
        monkeypatch.setattr(
            FastForward, "mtp_step", lambda self, *a, **kw: fake(functools.partial(real, self), *a, **kw)
        )
    else:
        monkeypatch.setattr(model, "mtp_step", functools.partial(fake, model.mtp_step))


@pytest.mark.parametrize("k,fast", [(1, True), (2, True), (4, True), (2, False)])
def test_speculative_greedy_equals_plain_random_mtp(model, k, fast):
    engine = Engine(model, fast=fast)
    plain = engine.generate(PROMPTS, N_NEW, stop_ids=[]).tokens
    spec = engine.generate(PROMPTS, N_NEW, stop_ids=[], speculative="mtp", draft_k=k)
    assert spec.tokens == plain


@pytest.mark.parametrize("k,fast", [(1, True), (3, True), (4, True), (3, False)])
def test_speculative_greedy_equals_plain_oracle_drafts(model, monkeypatch, k, fast):
    engine = Engine(model, fast=fast)
    plain = engine.generate(PROMPTS, N_NEW, stop_ids=[]).tokens
    oracle(model, PROMPTS, 0.25, monkeypatch, fast)
    spec = engine.generate(PROMPTS, N_NEW, stop_ids=[], speculative="mtp", draft_k=k)
    assert spec.tokens == plain
    assert spec.stats["mean_accepted_length"] > 1.3  # the accept + rollback paths really ran
    hits = spec.stats["acceptance_per_depth"]
    assert len(hits) == k and all(a >= b for a, b in itertools.pairwise(hits))


def test_speculative_stops_mid_block(model, monkeypatch):
    engine = Engine(model)
    plain = engine.generate(PROMPTS, N_NEW, stop_ids=[]).tokens
    stop = plain[0][5]
    oracle(model, PROMPTS, 0.0, monkeypatch, fast=True)
    spec = engine.generate(PROMPTS, N_NEW, stop_ids=[stop], speculative="mtp", draft_k=4)
    ref = Engine(model).generate(PROMPTS, N_NEW, stop_ids=[stop])
    assert spec.tokens == ref.tokens and spec.finish_reason == ref.finish_reason
    assert spec.stats["mean_accepted_length"] > 3


@pytest.mark.parametrize(
    "sampling, draft_vocab",
    [
        ({"temperature": 0.7}, None),
        ({"temperature": 1.0, "top_k": 4, "top_p": 0.9}, None),
        ({"temperature": 0.7}, [0, 2, 3]),
    ],
)
def test_speculative_sampling_keeps_distribution(sampling, draft_vocab):
    """First two sampled tokens over many rows: speculative frequencies == the model's exact joint p(x1) p(x2|x1),
    p being the same temperature/top-k/top-p transform plain sampling uses; also when the drafts come from a
    draft vocabulary of 3 of the 6 tokens (q is 0 elsewhere)."""
    from scipy import stats  # a declared test dependency (pyproject.toml [dev])

    cfg = ModelConfig.preset("tiny", vocab_size=6)
    model = GLM(cfg).init_weights(seed=1).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(40)  # sharper distributions so that rejections happen often
    prompt, n_rows, params = [1, 4, 2], 6000, SamplingParams(**sampling)
    with torch.inference_mode():
        p1 = probs(model(torch.tensor([prompt])).logits[0, -1], params)
        seqs = torch.tensor([prompt + [a] for a in range(6)])
        p2 = probs(model(seqs).logits[:, -1], params)  # (6, 6): p(x2 | x1 = a)
    joint = (p1[:, None] * p2).reshape(-1).double()
    engine = Engine(model)
    engine.draft_vocab = draft_vocab
    res = engine.generate([prompt] * n_rows, 2, seed=0, stop_ids=[], speculative="mtp", draft_k=2, **sampling)
    first_two = torch.tensor([t[:2] for t in res.tokens])
    counts = torch.bincount(first_two[:, 0] * 6 + first_two[:, 1], minlength=36).double()
    assert counts[joint == 0].sum() == 0  # nothing outside the top-k / top-p support
    keep = joint * n_rows > 5  # chi-square needs populated cells; the rest must stay (nearly) empty
    exp = joint[keep] * n_rows
    exp *= counts[keep].sum() / exp.sum()
    assert stats.chisquare(counts[keep].numpy(), exp.numpy()).pvalue > 1e-3
    assert 1.0 < res.stats["mean_accepted_length"] < 3.0


def test_rows_finishing_far_apart_stay_in_the_cache(model, monkeypatch):
    """Row 0's drafts are always right (done in ~N/5 steps), row 1's never (N steps): row 0 rides along."""
    engine = Engine(model)
    plain = engine.generate(PROMPTS[:2], N_NEW, stop_ids=[]).tokens
    oracle(model, PROMPTS[:2], [0.0, 1.0], monkeypatch, fast=True)
    spec = engine.generate(PROMPTS[:2], N_NEW, stop_ids=[], speculative="mtp", draft_k=4)
    assert spec.tokens == plain


@pytest.mark.parametrize("k", [1, 3])
def test_draft_vocabulary_keeps_greedy_output(model, k):
    """Drafting over the 64 most frequent tokens of some text (FR-Spec): the draft head is 64 rows, the output
    is plain greedy's."""
    engine = Engine(model)
    plain = engine.generate(PROMPTS, N_NEW, stop_ids=[]).tokens
    engine.draft_vocab = frequent_tokens(plain + PROMPTS + [list(range(0, 512, 3))], 64)
    assert len(engine.draft_vocab) == 64
    spec = engine.generate(PROMPTS, N_NEW, stop_ids=[], speculative="mtp", draft_k=k)
    assert spec.tokens == plain
    fwd = FastForward(model, 64, draft_vocab=engine.draft_vocab)
    cache = KVCache(1, 64)
    ids = torch.tensor([PROMPTS[0]])
    pos = torch.arange(ids.shape[1])[None]
    with torch.inference_mode():
        _, hidden = fwd.forward(ids, pos, cache)
        _, logits = fwd.mtp_step(0, ids, hidden, pos, cache)
        _, ref = model.mtp_step(0, ids, hidden, pos, KVCache(1, 64))
    assert logits.shape[-1] == 64  # the draft head's columns are the draft vocabulary's ids
    torch.testing.assert_close(logits, ref[..., engine.draft_vocab], rtol=1e-4, atol=1e-5)
