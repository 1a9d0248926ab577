"""Fused LM loss (loss.linear_cross_entropy) == the plain logits -> cross_entropy reference, forward and backward."""

import pytest
import torch

import glmstack.model.loss as loss_mod
from glmstack.model import GLM, ModelConfig
from glmstack.model.loss import cross_entropy, linear_cross_entropy


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("chunk", [2**24, 97 * 7])  # one chunk; ragged chunks of 7 rows
def test_fused_equals_reference(dtype, tol, chunk, monkeypatch):
    monkeypatch.setattr(loss_mod, "CHUNK_ELEMENTS", chunk)
    monkeypatch.setattr(loss_mod, "MIN_CHUNK_ROWS", 1)
    g = torch.Generator().manual_seed(0)
    h = torch.randn(2, 25, 16, generator=g).to(dtype)
    w = (torch.randn(97, 16, generator=g) * 0.5).to(dtype)
    labels = torch.randint(0, 97, (2, 25), generator=g)
    labels[0, :5] = -100
    grads = []
    for fused in (True, False):
        hh, ww = h.clone().requires_grad_(), w.clone().requires_grad_()
        loss = linear_cross_entropy(hh, ww, labels) if fused else cross_entropy(hh @ ww.t(), labels)
        (3.0 * loss).backward()
        grads.append((loss, hh.grad, ww.grad))
    for a, b in zip(*grads):
        torch.testing.assert_close(a.float(), b.float(), atol=tol, rtol=tol)
    with torch.no_grad():  # no gradients asked: loss only
        torch.testing.assert_close(linear_cross_entropy(h, w, labels), grads[1][0], atol=tol, rtol=tol)


def test_model_switch_same_losses_and_grads():
    ids = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(0))
    labels = torch.cat([ids[:, 1:], torch.full_like(ids[:, :1], -100)], 1)
    runs = []
    for fused in (True, False):
        model = GLM(ModelConfig.preset("tiny", fused_lm_loss=fused)).init_weights(seed=0)
        out = model(ids, labels=labels)
        out.loss.backward()
        runs.append((out, {n: p.grad for n, p in model.named_parameters()}))
    (a, ga), (b, gb) = runs
    torch.testing.assert_close(a.loss, b.loss, atol=1e-6, rtol=0)
    torch.testing.assert_close(a.mtp_loss, b.mtp_loss, atol=1e-6, rtol=0)
    torch.testing.assert_close(a.logits, b.logits)  # formed lazily on the fused side
    for n in ga:
        torch.testing.assert_close(ga[n], gb[n], atol=1e-6, rtol=1e-5, msg=n)
