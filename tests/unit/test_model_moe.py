"""MoE: grouped-GEMM experts == the per-expert loop (forward and backward), router details, balance loss."""

import pytest
import torch

from glmstack.model import ModelConfig
from glmstack.model.moe import MoE, Router, experts_grouped_mm, experts_loop, experts_sorted, sequence_balance_loss

pytestmark = pytest.mark.skipif(not hasattr(torch, "_grouped_mm"), reason="torch without _grouped_mm")


def _bank(E=8, D=32, F=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(E, 2 * F, D, generator=g) * 0.2, torch.randn(E, D, F, generator=g) * 0.2)


@pytest.mark.parametrize("fast", [experts_grouped_mm, experts_sorted])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
def test_fast_experts_equal_loop_forward_backward(fast, dtype, tol):
    T, K, E = 50, 3, 8
    g = torch.Generator().manual_seed(1)
    x = torch.randn(T, 32, generator=g)
    skew = torch.tensor([4.0, 2, 1, 1, 1, 1, 0.5, 0])  # uneven load; expert 7 never chosen (empty group)
    idx = (torch.rand(T, E, generator=g) * skew).topk(K, dim=-1).indices
    w = torch.rand(T, K, generator=g)
    results = []
    for fn in (fast, experts_loop):
        wgu, wd = (t.to(dtype).requires_grad_() for t in _bank())
        xx, ww = x.to(dtype).requires_grad_(), w.clone().requires_grad_()
        y = fn(xx, idx, ww, wgu, wd)
        y.float().pow(2).sum().backward()
        results.append([y.float(), xx.grad.float(), ww.grad, wgu.grad.float(), wd.grad.float()])
    for a, b in zip(*results):  # relative error in norm: bf16 sums in a different order
        assert (a - b).norm() <= tol * b.norm()


@pytest.mark.parametrize("fast", [experts_grouped_mm, experts_sorted])
def test_empty_experts_get_zero_grad(fast):
    x = torch.randn(6, 32)
    idx = torch.tensor([[0, 1]] * 6)
    wgu, wd = (t.requires_grad_() for t in _bank())
    fast(x, idx, torch.ones(6, 2), wgu, wd).pow(2).sum().backward()
    assert wgu.grad[2:].abs().sum() == 0 and wgu.grad[:2].abs().sum() > 0


def test_moe_switch_uses_reference_loop():
    cfg = ModelConfig.preset("tiny")
    moes = []
    for grouped in (True, False):
        torch.manual_seed(0)
        moe = MoE(ModelConfig.preset("tiny", use_grouped_mm=grouped))
        for t in list(moe.parameters()) + list(moe.buffers()):
            t.data.normal_(0, 0.2)
        moes.append(moe)
    x = torch.randn(2, 7, cfg.hidden_size)
    (ya, _, la, ia), (yb, _, lb, ib) = moes[0](x), moes[1](x)
    torch.testing.assert_close(ya, yb, atol=1e-5, rtol=1e-5)
    assert torch.equal(la, lb) and la.sum() == 2 * 7 * cfg.num_experts_per_tok and torch.equal(ia, ib)


def test_router_bias_chooses_but_does_not_weigh():
    cfg = ModelConfig.preset("tiny", norm_topk_prob=False, routed_scaling_factor=1.0)
    r = Router(cfg)
    r.weight.data.normal_()
    r.e_score_correction_bias.data.zero_()
    r.e_score_correction_bias.data[5] = 10.0  # forces expert 5 in every token's top-k
    x = torch.randn(9, cfg.hidden_size)
    scores, idx, w = r(x)
    assert (idx == 5).any(-1).all()
    torch.testing.assert_close(w, scores.gather(1, idx))  # gate values are the unbiased sigmoid scores


def test_group_limited_routing_stays_in_kept_groups():
    cfg = ModelConfig.preset("tiny", n_routed_experts=8, n_group=4, topk_group=1, num_experts_per_tok=2)
    r = Router(cfg)
    r.weight.data.normal_()
    r.e_score_correction_bias.data.zero_()
    _, idx, _ = r(torch.randn(20, cfg.hidden_size))
    assert torch.equal(idx[:, 0] // 2, idx[:, 1] // 2)  # both experts from the one kept group


def test_balance_loss_is_one_when_balanced():
    B, T, E, K = 2, 8, 4, 2
    scores = torch.full((B, T, E), 0.5)
    idx = torch.tensor([[0, 1], [2, 3]] * (T // 2)).expand(B, T, K)
    torch.testing.assert_close(sequence_balance_loss(scores, idx), torch.tensor(1.0))


def test_balance_loss_penalises_imbalance_and_its_gradient_rebalances():
    """Every token routed to experts 0 and 1, which also get most of the score: f = (2, 2, 0, 0) (E/(K T) x counts),
    P = (0.4, 0.4, 0.1, 0.1) -> loss 2*0.4 + 2*0.4 = 1.6 > 1. The gradient (through P only, f is a count) lowers
    the overloaded experts' scores and raises the idle ones'."""
    B, T = 1, 4  # E = 4 experts, K = 2 per token
    scores = torch.tensor([0.4, 0.4, 0.1, 0.1]).repeat(B, T, 1).requires_grad_()
    idx = torch.tensor([0, 1]).repeat(B, T, 1)
    loss = sequence_balance_loss(scores, idx)
    torch.testing.assert_close(loss, torch.tensor(1.6))
    loss.backward()
    g = scores.grad[0, 0]
    assert g[0] > 0 and g[1] > 0 and g[2] < 0 and g[3] < 0  # descent: overloaded experts down, idle ones up
    idx_spread = torch.tensor([[0, 1], [2, 3]]).repeat(B, T // 2, 1)  # the same scores, balanced routing
    assert sequence_balance_loss(scores.detach(), idx_spread) < loss


def test_replayed_experts_outside_own_topk_keep_their_gate_and_router_gradient():
    """Routing replay (R3): recorded experts that no token's own top-k chose get their gates from the router's FULL
    scores (renormalised, scaled) and their router rows a gradient; with the router's own choice those rows get none
    from the output (reading a top-k-masked copy would give the replayed experts exact zeros: Megatron-LM#79)."""
    cfg = ModelConfig.preset("tiny")
    torch.manual_seed(0)
    moe = MoE(cfg)
    for t in list(moe.parameters()) + list(moe.buffers()):
        t.data.normal_(0, 0.2)
    x = torch.randn(1, 2, cfg.hidden_size)
    with torch.no_grad():
        scores, own, _ = moe.gate(x[0])
    unchosen = [e for e in range(cfg.n_routed_experts) if e not in own.flatten().tolist()]
    replay = torch.tensor([unchosen[:2], unchosen[2:4]])  # (T, K): experts neither token would pick
    grads = []
    for r in (None, replay[None]):
        moe.zero_grad()
        y, _, _, own_BTK = moe(x, replay_BTK=r)
        y.pow(2).sum().backward()
        grads.append(moe.gate.weight.grad[replay.flatten()].abs().sum(-1))
        assert torch.equal(own_BTK[0].sort(-1).values, own.sort(-1).values)  # the trainer's own choice, still computed
    assert torch.all(grads[0] == 0) and torch.all(grads[1] > 0)
    picked = scores.gather(1, replay)
    want = picked / picked.sum(-1, keepdim=True) * cfg.routed_scaling_factor
    torch.testing.assert_close(moe.gate.gates(scores, replay), want)
    assert torch.all(want > 0)
    with torch.no_grad():  # the replayed output is the reference loop over the replayed experts with those gates
        y, *_ = moe(x, replay_BTK=replay[None])
        ref = experts_loop(x[0], replay, want, moe.experts.gate_up_proj, moe.experts.down_proj) + moe.shared_experts(x[0])
    torch.testing.assert_close(y[0], ref, atol=1e-5, rtol=1e-5)


def test_replay_rows_with_minus_one_keep_the_routers_choice():
    cfg = ModelConfig.preset("tiny")
    r = Router(cfg)
    r.weight.data.normal_()
    r.e_score_correction_bias.data.zero_()
    scores, own, w = r(torch.randn(3, cfg.hidden_size))
    replay = torch.tensor([[-1, -1], [5, 6], [-1, -1]])
    idx, gates = r.replay(scores, own, replay)
    assert torch.equal(idx[[0, 2]], own[[0, 2]]) and idx[1].tolist() == [5, 6]
    torch.testing.assert_close(gates[[0, 2]], w[[0, 2]])
