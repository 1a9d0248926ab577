"""Muon: bit-for-bit parity with torch.optim.Muon on 2-D matrices, NS vs the SVD polar factor, 3-D banks, split."""

import math

import pytest
import torch

from glmstack.optim.muon import Muon, lr_scale, zeropower_via_newtonschulz


def _run(opt_cls, params, grads_seq, **kw):
    params = [p.detach().clone().requires_grad_(True) for p in params]
    opt = opt_cls(params, **kw)
    for grads in grads_seq:
        for p, g in zip(params, grads):
            p.grad = g.clone()
        opt.step()
    return params


@pytest.mark.parametrize("adjust", ["original", "match_rms_adamw"])
@pytest.mark.parametrize("nesterov", [True, False])
def test_matches_torch_muon_bit_for_bit(adjust, nesterov):
    g = torch.Generator().manual_seed(0)
    shapes = [(32, 16), (16, 48), (24, 24)]
    params = [torch.randn(s, generator=g) for s in shapes]
    grads_seq = [[torch.randn(s, generator=g) for s in shapes] for _ in range(4)]
    kw = {"lr": 0.02, "weight_decay": 0.1, "momentum": 0.95, "nesterov": nesterov, "adjust_lr_fn": adjust}
    ours = _run(Muon, params, grads_seq, **kw)
    ref = _run(torch.optim.Muon, params, grads_seq, **kw)
    for a, b in zip(ours, ref):
        assert torch.equal(a, b)


def test_stacked_same_shape_matrices_match_torch_muon_bit_for_bit():
    # several matrices of one shape (and their transposes) run Newton–Schulz as one stacked batch
    g = torch.Generator().manual_seed(4)
    shapes = [(16, 32)] * 3 + [(32, 16)] * 2 + [(24, 64)]
    params = [torch.randn(s, generator=g) for s in shapes]
    grads_seq = [[torch.randn(s, generator=g) for s in shapes] for _ in range(3)]
    kw = {"lr": 0.02, "weight_decay": 0.1, "momentum": 0.95, "nesterov": True, "adjust_lr_fn": "match_rms_adamw"}
    for a, b in zip(_run(Muon, params, grads_seq, **kw), _run(torch.optim.Muon, params, grads_seq, **kw)):
        assert torch.equal(a, b)


def test_newton_schulz_near_polar_factor():
    # Keller Jordan / torch docstring: NS gives U S' Vᵀ with S' in about (0.5, 1.5); arch-math.md §5.1 measured
    # 0.68–1.14 on a Gaussian (1024, 256). Check singular values and direction against the SVD polar factor.
    G = torch.randn(256, 64, generator=torch.Generator().manual_seed(1))
    O = zeropower_via_newtonschulz(G).float()
    U, _S, Vh = torch.linalg.svd(G, full_matrices=False)
    polar = U @ Vh
    s = torch.linalg.svdvals(O)
    assert s.min() > 0.5 and s.max() < 1.5, (s.min(), s.max())
    cos = (O * polar).sum() / (O.norm() * polar.norm())
    assert cos > 0.97, cos


def test_bank_is_per_expert_batch():
    bank = torch.randn(3, 16, 40, generator=torch.Generator().manual_seed(2))
    batched = zeropower_via_newtonschulz(bank).float()
    for e in range(3):
        single = zeropower_via_newtonschulz(bank[e]).float()
        assert torch.allclose(batched[e], single, atol=2e-2), (batched[e] - single).abs().max()


def test_bank_step_uses_per_matrix_scale():
    p = torch.nn.Parameter(torch.zeros(2, 8, 32))
    p.grad = torch.randn(2, 8, 32)
    Muon([p], lr=1.0, weight_decay=0.0).step()
    rms = p.detach().pow(2).mean().sqrt()
    assert 0.15 < rms < 0.22, rms  # Moonlight: 0.2·sqrt(max(A,B)) gives update RMS ~0.2 per matrix
    assert lr_scale((8, 32), "match_rms_adamw") == pytest.approx(0.2 * math.sqrt(32))


def test_split_orthogonalises_each_head():
    p = torch.nn.Parameter(torch.zeros(4 * 8, 16))
    p.grad = torch.randn(32, 16, generator=torch.Generator().manual_seed(3))
    opt = Muon([{"params": [p], "blocks": (4, (8,))}], lr=1.0, weight_decay=0.0, momentum=0.0, nesterov=False)
    opt.step()
    expected = -zeropower_via_newtonschulz(p.grad.view(4, 8, 16)).float().reshape(32, 16) * lr_scale(
        (8, 16), "match_rms_adamw"
    )
    assert torch.allclose(p.detach(), expected, atol=1e-6)


def test_rejects_vectors():
    with pytest.raises(ValueError, match="2-D matrices or 3-D banks"):
        Muon([torch.nn.Parameter(torch.zeros(4))])
