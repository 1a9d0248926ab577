"""Sampling transforms: temperature/top-k/top-p match transformers' warpers; greedy; seeded reproducibility."""

import pytest
import torch

from glmstack.inference.sampling import SamplingParams, filter_logits, probs, sample


def test_greedy_is_argmax_and_probs_one_hot():
    logits = torch.randn(4, 11)
    p = SamplingParams(temperature=0.0)
    assert torch.equal(sample(logits, p), logits.argmax(-1))
    assert torch.equal(probs(logits, p).argmax(-1), logits.argmax(-1)) and probs(logits, p).sum().item() == 4


def test_top_k_keeps_k():
    logits = torch.randn(5, 20)
    kept = torch.isfinite(filter_logits(logits, SamplingParams(top_k=3)))
    assert kept.sum(-1).tolist() == [3] * 5


def test_top_p_matches_transformers_warper():
    tr = pytest.importorskip("transformers.generation.logits_process")
    logits = torch.randn(6, 50) * 3
    for top_p in (0.1, 0.5, 0.9):
        ref = tr.TopPLogitsWarper(top_p)(None, logits.clone())
        ours = filter_logits(logits, SamplingParams(top_p=top_p))
        assert torch.equal(torch.isfinite(ref), torch.isfinite(ours))


def test_temperature_and_top_k_match_transformers():
    tr = pytest.importorskip("transformers.generation.logits_process")
    logits = torch.randn(3, 30)
    ref = tr.TopKLogitsWarper(5)(None, tr.TemperatureLogitsWarper(0.7)(None, logits.clone()))
    torch.testing.assert_close(filter_logits(logits, SamplingParams(temperature=0.7, top_k=5)), ref)


def test_seeded_sampling_reproducible_and_follows_distribution():
    logits = torch.tensor([[0.0, 1.0, 2.0]]).expand(20000, -1)
    params = SamplingParams(temperature=1.0)
    a = sample(logits, params, torch.Generator().manual_seed(3))
    b = sample(logits, params, torch.Generator().manual_seed(3))
    assert torch.equal(a, b)
    freq = torch.bincount(a, minlength=3).float() / a.numel()
    torch.testing.assert_close(freq, torch.softmax(logits[0], -1), atol=0.015, rtol=0)


@pytest.mark.parametrize("kw", [{"temperature": -1.0}, {"top_p": 0.0}, {"top_p": 1.5}, {"top_k": -2}])
def test_bad_params_raise(kw):
    with pytest.raises(ValueError):
        SamplingParams(**kw)
