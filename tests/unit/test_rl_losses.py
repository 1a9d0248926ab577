"""The RL objectives against hand-computed values and gradients (glmstack/posttrain/rl/losses.py)."""

import math
from types import SimpleNamespace

import pytest
import torch

from glmstack.posttrain.rl import losses as L


def test_group_advantages_bessel_std_and_mean_only():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 2.0, 2.0, 4.0, 4.0])
    a = L.group_advantages(r, group_size=4)
    # group 1: mean .25, std (Bessel) = sqrt((.5625 + 3 * .0625) / 3) = .5
    assert a[:4].tolist() == pytest.approx([0.75 / (0.5 + 1e-6), -0.25 / (0.5 + 1e-6)] + [-0.25 / (0.5 + 1e-6)] * 2)
    s2 = math.sqrt(4 / 3)
    assert a[4:].tolist() == pytest.approx([-1 / (s2 + 1e-6)] * 2 + [1 / (s2 + 1e-6)] * 2)
    assert L.group_advantages(r, 4, std_normalize=False).tolist() == [0.75, -0.25, -0.25, -0.25, -1, -1, 1, 1]
    assert L.group_advantages(torch.tensor([3.0, 5.0]), 1).tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="groups of 3"):
        L.group_advantages(r, 3)


def test_equal_rewards_give_zero_gradient():
    adv = L.group_advantages(torch.full((4,), 0.7), group_size=4)
    logp = torch.randn(4, 5, requires_grad=True)
    loss, _ = L.policy_loss(logp, logp.detach(), adv, torch.ones(4, 5))
    loss.backward()
    assert torch.count_nonzero(logp.grad) == 0


def _case():
    torch.manual_seed(0)
    logp = (torch.randn(3, 4) - 2).requires_grad_()
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.float32)
    adv = torch.tensor([1.0, -0.5, 2.0])
    return logp, mask, adv


@pytest.mark.parametrize("reduction", ["sample", "token", "constant"])
def test_on_policy_gradient_is_minus_advantage_times_score(reduction):
    logp, mask, adv = _case()
    loss, stats = L.policy_loss(logp, logp.detach(), adv, mask, rollout_logp=logp.detach(), reduction=reduction,
                                mismatch="icepop", max_len=4)
    loss.backward()
    # on policy r = 1 and dr/dlogp = 1: d loss / d logp_t = -A_i * m_t / divisor
    divisor = {"sample": mask.sum(1, keepdim=True) * 3, "token": mask.sum(), "constant": torch.tensor(12.0)}[reduction]
    expected = -adv[:, None] * mask / divisor
    torch.testing.assert_close(logp.grad, expected)
    assert loss.item() == pytest.approx(float(-(adv[:, None] * mask / divisor).sum()))
    assert stats["clip_frac"] == 0 and stats["mismatch_masked_frac"] == 0 and stats["mean_abs_logp_diff"] == 0


def test_clip_higher_hand_case():
    # one token each: A > 0 clips above 1.28, A < 0 clips below 0.8
    old = torch.zeros(4, 1)
    r = torch.tensor([[1.5], [1.1], [0.5], [0.9]])
    logp = r.log().requires_grad_()
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0])
    loss, stats = L.policy_loss(logp, old, adv, torch.ones(4, 1))
    # per token: -min(rA, clip(r)A): [-1.28, -1.1, 0.8, 0.9]
    assert loss.item() == pytest.approx((-1.28 - 1.1 + 0.8 + 0.9) / 4)
    loss.backward()
    # clipped tokens get no gradient; others -A * r / 4
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0], [-1.1 / 4], [0.0], [0.9 / 4]]))
    assert stats["clip_frac"] == 0.5


def test_icepop_and_tis_weights():
    old = torch.zeros(1, 4)
    rollout = -torch.tensor([[math.log(0.4), math.log(0.5), math.log(2.0), math.log(3.0)]])  # rho = .4 .5 2 3
    logp = old.clone().requires_grad_()
    adv = torch.tensor([1.0])
    loss, stats = L.policy_loss(logp, old, adv, torch.ones(1, 4), rollout_logp=rollout, mismatch="icepop")
    assert loss.item() == pytest.approx(-(0.5 + 2.0) / 4)  # closed interval: 0.5 and 2 kept
    assert stats["mismatch_masked_frac"] == 0.5
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, -0.5, -2.0, 0.0]]) / 4)
    loss, stats = L.policy_loss(old, old, adv, torch.ones(1, 4), rollout_logp=rollout, mismatch="tis")
    assert loss.item() == pytest.approx(-(0.5 + 0.5 + 2.0 + 2.0) / 4)
    assert stats["mean_abs_logp_diff"] == pytest.approx((math.log(2.5) + math.log(2) * 2 + math.log(3)) / 4)
    with pytest.raises(ValueError, match="rollout_logp"):
        L.policy_loss(old, old, adv, torch.ones(1, 4), mismatch="icepop")


def test_dis_masks_both_sides_open_interval():
    rollout = torch.zeros(1, 4)
    r = torch.tensor([[0.8, 0.9, 1.2, 1.3]])  # eps .2 / .28: 0.8 is on the open bound -> out; 1.3 out
    logp = r.log().requires_grad_()
    for sign in (1.0, -1.0):
        logp.grad = None
        loss, stats = L.dis_loss(logp, rollout, torch.tensor([sign]), torch.ones(1, 4), eps_low=0.2, eps_high=0.28)
        loss.backward()
        torch.testing.assert_close(logp.grad, -sign * torch.tensor([[0.0, 0.9, 1.2, 0.0]]) / 4)
        assert stats["masked_frac"] == 0.5


def test_distill_advantages_stop_gradient():
    t = torch.tensor([[-1.0, -2.0]])
    s = torch.tensor([[-1.5, -1.0]], requires_grad=True)
    a = L.distill_advantages(t, s)
    assert a.tolist() == [[0.5, -1.0]] and not a.requires_grad
    loss, _ = L.policy_loss(s, s.detach(), a, torch.ones(1, 2), reduction="token")
    loss.backward()  # on policy: grad = -A / n
    torch.testing.assert_close(s.grad, torch.tensor([[-0.25, 0.5]]))


def test_cispo_keeps_gradient_of_clipped_tokens():
    old = torch.zeros(1, 2)
    logp = torch.tensor([[math.log(2.0), 0.0]], requires_grad=True)
    loss, stats = L.cispo_loss(logp, old, torch.tensor([1.0]), torch.ones(1, 2))
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-1.28, -1.0]]) / 2)
    assert stats["clip_frac"] == 0.5


def test_rl_loss_passes_eps_to_cispo():
    """rl.eps_low / rl.eps_high reach CISPO's clip (issue 35: rl_loss called cispo_loss with its defaults, so the
    two settings below gave the same loss)."""
    from glmstack.posttrain.rl.stage import RLOptions, rl_loss

    torch.manual_seed(0)
    policy = torch.nn.Embedding(5, 5)
    model = lambda ids, **_: SimpleNamespace(logits=policy(ids))
    ids, targets, mask = torch.randint(0, 5, (2, 4)), torch.randint(0, 5, (2, 4)), torch.ones(2, 4)
    logp = L.token_logprobs(policy(ids).float(), targets).detach()
    old = logp + torch.tensor([[0.5, -0.5, 1.0, -1.0]] * 2)  # ratios e^-0.5, e^0.5, e^-1, e^1
    adv = torch.tensor([1.0, -1.0])
    batch = {"input_ids": ids, "targets": targets, "temperature": 1.0, "mask": mask, "old_logp": old,
             "rollout_logp": logp, "advantages": adv, "stats": {}}  # fmt: skip

    def loss(eps_low, eps_high):
        got = rl_loss(RLOptions(loss="cispo", eps_low=eps_low, eps_high=eps_high))(model, batch, {})[0]
        want = L.cispo_loss(logp, old, adv, mask, eps_low=eps_low, eps_high=eps_high)[0]
        assert got.item() == pytest.approx(want.item())
        return got.item()

    assert loss(0.2, 0.28) != pytest.approx(loss(1.0, 5.0))


def test_gspo_sequence_ratio():
    old = torch.zeros(2, 3)
    logp = torch.tensor([[0.3, -0.3, 9.0], [0.0, 0.0, 0.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    loss, stats = L.gspo_loss(logp, old, torch.tensor([1.0, -1.0]), mask)
    assert loss.item() == pytest.approx(0.0) and stats["ratio_mean"] == pytest.approx(1.0)
    loss.backward()  # d/dlogp_t of -s A / 2 at s = 1: -A m_t / (|y| * 2)
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.25, -0.25, 0.0], [1 / 6, 1 / 6, 1 / 6]]))


def test_kl_estimators_and_entropy_and_regularised():
    lp, ref = torch.tensor([[0.0, -1.0]]), torch.tensor([[-1.0, -1.0]])
    assert L.kl_penalty(lp, ref, "k1").tolist() == [[1.0, 0.0]]
    assert L.kl_penalty(lp, ref, "k2").tolist() == [[0.5, 0.0]]
    assert L.kl_penalty(lp, ref, "k3")[0, 0].item() == pytest.approx(math.exp(-1) - 1 + 1)
    h = L.entropy(torch.zeros(1, 2, 4))
    torch.testing.assert_close(h, torch.full((1, 2), math.log(4)))
    m = torch.ones(1, 2)
    total = L.regularised(torch.tensor(1.0), m, entropy_BT=h, entropy_coef=0.1, kl_BT=torch.ones(1, 2), kl_coef=0.5)
    assert total.item() == pytest.approx(1.0 - 0.1 * math.log(4) + 0.5)


def test_token_logprobs_temperature_and_nucleus():
    logits = torch.tensor([[[2.0, 1.0, 0.0, -5.0]]], requires_grad=True)
    tok = torch.tensor([[1]])
    lp = L.token_logprobs(logits, tok, temperature=0.5)
    assert lp.item() == pytest.approx(float(torch.log_softmax(logits.detach() / 0.5, -1)[0, 0, 1]))
    # top_p 0.7 keeps the two likeliest (p1 ~ .665 < .7): renormalised over them
    lp = L.token_logprobs(logits, tok, top_p=0.7)
    assert lp.item() == pytest.approx(math.log(math.exp(1) / (math.exp(2) + math.exp(1))))
    lp.sum().backward()
    assert logits.grad[0, 0, 2:].abs().sum() == 0
    assert L.token_logprobs(logits, torch.tensor([[3]]), top_p=0.7).item() == float("-inf")


def test_reduction_errors():
    with pytest.raises(ValueError, match="max_len"):
        L.reduce(torch.ones(1, 2), torch.ones(1, 2), "constant")
    with pytest.raises(ValueError, match="reduction"):
        L.reduce(torch.ones(1, 2), torch.ones(1, 2), "mean")
