"""The acceptance rules on toy distributions: rejection sampling leaves the target distribution unchanged.

A toy 'target model' is a table P0[x1], P1[x1, x2], P2[x1, x2, x3] over a 4-token vocabulary and a different
toy 'draft model' Q0, Q1. Many independent rows run one draft-verify step with k = 2 drafts; the joint
frequency of the first two emitted tokens must match P0[a] * P1[a, b] (chi-square, fixed seed).
"""

import pytest
import torch

from glmstack.inference.accept import accept_greedy, accept_sampled

from scipy import stats  # a declared test dependency (pyproject.toml [dev])
V, N = 4, 200_000


def tables(seed, zeros=False):
    g = torch.Generator().manual_seed(seed)
    t = [torch.rand(*([V] * (i + 1)), generator=g) ** 2 for i in range(3)]
    if zeros:  # top-k/top-p style holes: some tokens impossible under one model but not the other
        t[0][0] = 0.0
        t[1][:, 1] = 0.0
    return [x / x.sum(-1, keepdim=True) for x in t]


def run_step(P, Q, g):
    d1 = torch.multinomial(Q[0].expand(N, V), 1, generator=g).squeeze(1)
    d2 = torch.multinomial(Q[1][d1], 1, generator=g).squeeze(1)
    p = torch.stack([P[0].expand(N, V), P[1][d1], P[2][d1, d2]], 1)  # (N, 3, V)
    q = torch.stack([Q[0].expand(N, V), Q[1][d1]], 1)  # (N, 2, V)
    n, nxt = accept_sampled(torch.stack([d1, d2], 1), q, p, g)
    first = torch.where(n >= 1, d1, nxt)
    # when the first draft was rejected the second token comes from the next step, i.e. from P1[first]
    later = torch.multinomial(P[1][first], 1, generator=g).squeeze(1)
    second = torch.where(n >= 2, d2, torch.where(n == 1, nxt, later))
    return n, first, second


@pytest.mark.parametrize("zeros", [False, True])
def test_rejection_sampling_keeps_target_distribution(zeros):
    P, Q = tables(0, zeros), tables(1, zeros=False)
    if zeros:
        Q[0] = torch.roll(P[0], 1)  # draft puts mass where the target has none and vice versa
    n, first, second = run_step(P, Q, torch.Generator().manual_seed(2))
    joint = torch.bincount(first * V + second, minlength=V * V).double()
    expected = (P[0][:, None] * P[1]).reshape(-1).double() * N
    keep = expected > 0
    assert joint[~keep].sum() == 0, "emitted a token the target gives probability 0"
    exp = expected[keep] * (joint[keep].sum() / expected[keep].sum())  # exact float sums for scipy
    p_value = stats.chisquare(joint[keep].numpy(), exp.numpy()).pvalue
    assert p_value > 1e-3, p_value
    assert 0 < n.float().mean() < 2


def test_acceptance_rate_matches_theory():
    """P(accept x1) = sum_x min(p(x), q(x)) = 1 - TV(p, q)."""
    P, Q = tables(3), tables(4)
    n, _, _ = run_step(P, Q, torch.Generator().manual_seed(5))
    expected = torch.minimum(P[0], Q[0]).sum().item()
    assert abs((n >= 1).float().mean().item() - expected) < 0.005


def test_identical_draft_always_accepted():
    P = tables(6)
    n, _, _ = run_step(P, P, torch.Generator().manual_seed(7))
    assert (n == 2).all()


def test_greedy_rule_and_one_hot_rejection_agree():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 4, 6, generator=g)  # K = 3 drafts
    target = logits.argmax(-1)
    draft = target[:, :3].clone()
    flip = torch.rand(64, 3, generator=g) < 0.3
    draft[flip] = (draft[flip] + 1) % 6
    n, nxt = accept_greedy(draft, logits)
    expect_n = (draft == target[:, :3]).long().cumprod(1).sum(1)
    assert torch.equal(n, expect_n) and torch.equal(nxt, target.gather(1, n[:, None]).squeeze(1))
    one_hot = torch.nn.functional.one_hot
    n2, nxt2 = accept_sampled(draft, one_hot(draft, 6).float(), one_hot(target, 6).float(), g)
    assert torch.equal(n, n2) and torch.equal(nxt, nxt2)
