"""RMSNorm's fused CPU path (torch's F.rms_norm) against the plain reference (transformers' op sequence)."""

import pytest
import torch

from glmstack.model.layers import RMSNorm, rms_norm_reference


@pytest.mark.parametrize("shape", [(2, 7, 64), (3, 5, 4, 32), (8, 256)])
def test_fused_rms_norm_is_the_reference_bit_for_bit(shape):
    g = torch.Generator().manual_seed(0)
    norm = RMSNorm(shape[-1], 1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(shape[-1], generator=g))
    x = (3 * torch.randn(shape, generator=g)).requires_grad_()
    x_ref = x.detach().clone().requires_grad_()
    w_ref = norm.weight.detach().clone().requires_grad_()
    y, y_ref = norm(x), rms_norm_reference(x_ref, w_ref, 1e-5)
    assert torch.equal(y, y_ref)
    dy = torch.randn(shape, generator=g)
    y.backward(dy)
    y_ref.backward(dy)
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(norm.weight.grad, w_ref.grad, rtol=1e-5, atol=1e-5)


def test_bf16_keeps_the_reference():
    norm = RMSNorm(16, 1e-6)
    with torch.no_grad():
        norm.weight.fill_(1.5)
    x = torch.randn(4, 16).bfloat16()
    assert torch.equal(norm.bfloat16()(x), rms_norm_reference(x, norm.weight, 1e-6))
