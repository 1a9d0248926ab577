"""glmstack.model.gemm (oneDNN fp32 GEMMs on CPU) == torch's matmul / F.linear, forward and backward.

Only the summation order differs, so values agree to fp32 rounding (relative 1e-5 on these sizes); switched off
(gemm.ENABLED = False, as GLMSTACK_ONEDNN=0) or on small blocks, it IS torch's, bit for bit.
"""

import pytest
import torch
import torch.nn.functional as F

from glmstack.model import gemm

pytestmark = pytest.mark.skipif(not gemm.AVAILABLE, reason="torch built without oneDNN")


def _close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * b.abs().max().item())


@pytest.mark.parametrize("shape", [(64, 48, 96), (300, 256, 33), (2048, 256, 512), (40, 7, 1024)])
def test_mm_and_mm_tn_equal_torch(shape):
    M, K, N = shape
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
    _close(gemm.mm(a, b), a @ b)
    _close(gemm.mm(a, b.t().contiguous().t()), a @ b)  # a transposed view as the right operand
    c = torch.randn(M, N, generator=g)
    _close(gemm.mm_tn(a, c), a.t() @ c)
    _close(gemm.mm_tn(c, a), c.t() @ a)  # the other operand is the smaller one now
    out = torch.empty(M, N)
    assert gemm.mm(a, b, out=out) is out
    _close(out, a @ b)


@pytest.mark.parametrize("bias", [False, True])
def test_linear_forward_backward_equal_torch(bias):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 64, 128, generator=g).transpose(0, 1)  # non-contiguous (64, 4, 128)
    w = torch.randn(256, 128, generator=g)
    b = torch.randn(256, generator=g) if bias else None
    grads = []
    for fn in (gemm.linear, F.linear):
        xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
        bs = b.clone().requires_grad_() if bias else None
        y = fn(xs, ws, bs)
        (y.square().sum() / y.numel()).backward()
        grads.append((y, xs.grad, ws.grad, bs.grad if bias else None))
    for ours, ref in zip(*grads):
        if ref is not None:
            _close(ours, ref)


def test_off_and_small_blocks_are_torch_exactly(monkeypatch):
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(8, 64, generator=g), torch.randn(32, 64, generator=g)  # 8 rows < MIN_ROWS
    assert torch.equal(gemm.linear(x, w), F.linear(x, w))
    monkeypatch.setattr(gemm, "ENABLED", False)
    x = torch.randn(128, 64, generator=g)
    assert torch.equal(gemm.linear(x, w), F.linear(x, w))
    assert torch.equal(gemm.mm(x, w.t()), x @ w.t())


def test_linear_module_keeps_nn_linear_names():
    m = gemm.Linear(16, 8, bias=True)
    assert isinstance(m, torch.nn.Linear) and set(m.state_dict()) == {"weight", "bias"}
