"""PPO's pure functions (posttrain/rl/ppo.py) checked by hand: GAE against a plain Python loop, KL-in-reward, the
clipped value loss against its formula (and its gradient), whitening, explained variance, the combined loss's
gradient against autograd of the written-out objective."""

from __future__ import annotations

import pytest
import torch

from glmstack.posttrain.rl.ppo import explained_variance, gae, kl_rewards, ppo_loss, value_loss, whiten


def gae_reference(rewards, values, mask, gamma, lam):
    """Per row: the masked positions in order are the steps; walk them backwards in plain Python floats."""
    B, T = len(rewards), len(rewards[0])
    adv, ret = [[0.0] * T for _ in range(B)], [[0.0] * T for _ in range(B)]
    for b in range(B):
        steps = [t for t in range(T) if mask[b][t] > 0]
        next_v, next_a = 0.0, 0.0
        for t in reversed(steps):
            delta = rewards[b][t] + gamma * next_v - values[b][t]
            next_a = delta + gamma * lam * next_a
            next_v = values[b][t]
            adv[b][t], ret[b][t] = next_a, next_a + values[b][t]
    return adv, ret


@pytest.mark.parametrize("gamma,lam", [(1.0, 0.95), (0.9, 0.5), (1.0, 1.0), (0.99, 0.0)])
def test_gae_equals_the_python_loop(gamma, lam):
    g = torch.Generator().manual_seed(0)
    r, v = torch.randn(4, 9, generator=g, dtype=torch.float64), torch.randn(4, 9, generator=g, dtype=torch.float64)
    mask = torch.zeros(4, 9)
    mask[0, 3:7] = 1  # a single-turn response
    mask[1, 2:4], mask[1, 6:9] = 1, 1  # two turns with a tool output between them (skipped, not a step)
    mask[2, 8] = 1  # one token
    # row 3: no response at all
    adv, ret = gae(r, v, mask, gamma, lam)
    want_adv, want_ret = gae_reference(r.tolist(), v.tolist(), mask.tolist(), gamma, lam)
    torch.testing.assert_close(adv, torch.tensor(want_adv, dtype=torch.float64), atol=1e-12, rtol=0)
    torch.testing.assert_close(ret, torch.tensor(want_ret, dtype=torch.float64), atol=1e-12, rtol=0)


def test_gae_lambda_one_gamma_one_is_reward_to_go_minus_value():
    """γ = λ = 1: A_t = Σ_{k >= t} r_k − V_t (Monte Carlo), whatever the values."""
    r = torch.tensor([[0.0, 0.1, -0.2, 1.0]])
    v = torch.tensor([[0.0, 0.5, 0.3, 0.7]])
    mask = torch.tensor([[0.0, 1.0, 1.0, 1.0]])
    adv, ret = gae(r, v, mask, 1.0, 1.0)
    torch.testing.assert_close(ret, torch.tensor([[0.0, 0.9, 0.8, 1.0]]))
    torch.testing.assert_close(adv, ret - v * mask)


def test_kl_rewards_put_the_sequence_reward_at_the_last_response_token():
    old = torch.tensor([[0.0, -1.0, -2.0, -0.5, 0.0], [0.0, -1.0, -1.0, 0.0, 0.0]])
    ref = torch.tensor([[0.0, -1.5, -1.0, float("-inf"), 0.0], [0.0, -0.5, -1.0, 0.0, 0.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0]])
    rewards, kl = kl_rewards(torch.tensor([2.0, 5.0]), old, ref, mask, kl_coef=0.1)
    torch.testing.assert_close(kl, torch.tensor([[0.0, 0.5, -1.0, 0.0, 0.0], [0.0] * 5]))  # -inf ref: 0
    torch.testing.assert_close(
        rewards, torch.tensor([[0.0, -0.05, 0.1, 2.0, 0.0], [0.0] * 5])
    )  # no response: no reward


def test_value_loss_is_the_clipped_formula_and_its_gradient():
    v = torch.tensor([[0.0, 0.5, 1.0, -0.3]], requires_grad=True)
    old = torch.tensor([[0.0, 0.0, 0.9, 0.0]])
    ret = torch.tensor([[0.0, 1.0, 0.0, -0.5]])
    mask = torch.tensor([[0.0, 1.0, 1.0, 1.0]])
    loss, frac = value_loss(v, old, ret, mask, clip=0.2, reduction="token")
    # by hand, token 1: V_clip = 0.2, (0.5-1)^2 = 0.25 < (0.2-1)^2 = 0.64 -> clipped branch, constant in V
    #          token 2: V_clip = 1.0 (inside), both 1.0 -> unclipped branch; token 3: V_clip = -0.2, 0.04 < 0.09
    want = 0.5 * (0.64 + 1.0 + 0.09) / 3
    torch.testing.assert_close(loss, torch.tensor(want))
    assert frac == pytest.approx(2 / 3)
    loss.backward()
    # gradient flows only through the unclipped token: d/dV 0.5 (V − R)^2 / 3 = (1.0 − 0) / 3
    torch.testing.assert_close(v.grad, torch.tensor([[0.0, 0.0, 1.0 / 3, 0.0]]))
    plain, frac0 = value_loss(v.detach(), old, ret, mask, clip=0.0, reduction="token")
    torch.testing.assert_close(plain, torch.tensor(0.5 * (0.25 + 1.0 + 0.04) / 3))
    assert frac0 == 0.0


def test_whiten_and_explained_variance():
    x = torch.tensor([[9.0, 1.0, 2.0, 3.0], [9.0, 4.0, 9.0, 9.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0, 1.0], [0.0, 1.0, 0.0, 0.0]])
    w = whiten(x, mask)
    kept = w[mask > 0]
    assert abs(float(kept.mean())) < 1e-6 and abs(float(kept.var(unbiased=False)) - 1) < 1e-5
    assert float(w[mask == 0].abs().sum()) == 0.0
    ret = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
    m = torch.tensor([[0.0, 1.0, 1.0, 1.0]])
    assert explained_variance(ret, ret, m) == pytest.approx(1.0)
    assert explained_variance(torch.full_like(ret, 2.0), ret, m) == pytest.approx(0.0)  # the mean: 0
    assert explained_variance(torch.zeros_like(ret), torch.full_like(ret, 1.0), m) == 0.0  # constant returns


def test_ppo_loss_gradient_equals_the_written_out_objective():
    """ppo_loss's gradient in logp and values == autograd of the objective written here in plain torch."""
    g = torch.Generator().manual_seed(3)
    B, T = 3, 6
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 2
    logp = (old + 0.6 * torch.randn(B, T, generator=g, dtype=torch.float64)).requires_grad_(True)
    old_v = torch.randn(B, T, generator=g, dtype=torch.float64)
    values = (old_v + 0.4 * torch.randn(B, T, generator=g, dtype=torch.float64)).requires_grad_(True)
    ret, adv = torch.randn(B, T, generator=g, dtype=torch.float64), torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = (torch.rand(B, T, generator=g) > 0.3).double()
    eps_low, eps_high, clip, c = 0.2, 0.28, 0.2, 0.5
    loss, stats = ppo_loss(logp, old, adv, mask, values, old_v, ret, value_clip=clip, vf_coef=c, reduction="sample",
                           eps_low=eps_low, eps_high=eps_high)  # fmt: skip
    loss.backward()
    got = logp.grad.clone(), values.grad.clone()
    logp.grad, values.grad = None, None
    r = torch.exp(logp - old)
    pg_t = torch.maximum(-r * adv, -torch.clamp(r, 1 - eps_low, 1 + eps_high) * adv)
    v_c = old_v + torch.clamp(values - old_v, -clip, clip)
    vf_t = 0.5 * torch.maximum((values - ret) ** 2, (v_c - ret) ** 2)
    per_sample = ((pg_t + c * vf_t) * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    hand = per_sample.mean()
    hand.backward()
    torch.testing.assert_close(loss, hand)
    torch.testing.assert_close(got[0], logp.grad)
    torch.testing.assert_close(got[1], values.grad)
    assert 0 < stats["clip_frac"] < 1 and 0 < stats["vf_clip_frac"] < 1
    assert {"value_loss", "policy_loss", "values_mean", "returns_mean"} <= stats.keys()
