"""model/invariant.py: inside batch_invariant() a token's numbers do not depend on the call it shares, so the
engine's decode (left-padded rows, a KV cache, one token a step) and the trainer's whole-sequence forward give the
same log-probs bit for bit, fp32 and bf16 autocast; the invariant forward and backward are the plain ones up to
rounding."""

from __future__ import annotations

import contextlib

import pytest
import torch

from glmstack.inference import Engine
from glmstack.model import GLM, ModelConfig, invariant
from glmstack.model.invariant import batch_invariant
from glmstack.posttrain.rl.losses import token_logprobs


def tiny_moe(seed: int = 0) -> GLM:
    return GLM(ModelConfig.preset("tiny")).init_weights(seed=seed).eval()  # 3 layers, 8 experts, MTP


def amp(dtype):
    return torch.autocast("cpu", dtype=torch.bfloat16) if dtype == "bf16" else contextlib.nullcontext()


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_mm_rows_do_not_depend_on_the_call(dtype):
    g = torch.Generator().manual_seed(0)
    dt = torch.bfloat16 if dtype == "bf16" else torch.float32
    a, b = torch.randn(300, 64, generator=g).to(dt), torch.randn(64, 96, generator=g).to(dt)
    whole = invariant.mm(a, b)
    for lo, hi in ((0, 1), (5, 6), (3, 40), (31, 33), (100, 300), (7, 263)):
        assert torch.equal(invariant.mm(a[lo:hi], b), whole[lo:hi]), (lo, hi)


def test_attention_decode_equals_the_whole_sequence():
    """One query against a left-padded cache == that query's row of the causal whole-sequence attention."""
    g = torch.Generator().manual_seed(1)
    B, H, G, T, Dh = 2, 4, 2, 70, 16
    q, k, v = (torch.randn(B, n, T, Dh, generator=g) for n in (H, G, G))
    with batch_invariant():
        whole = invariant.attention(q, k, v)
        for t in (0, 31, 32, 33, 69):
            pad = 5  # the row sits after 5 padding keys, as the engine's KV cache holds it
            kp, vp = (torch.cat([torch.randn(B, G, pad, Dh, generator=g), x[:, :, : t + 1]], 2) for x in (k, v))
            mask = torch.zeros(B, 1, 1, pad + t + 1, dtype=torch.bool)
            mask[..., pad:] = True
            one = invariant.attention(q[:, :, t : t + 1], kp, vp, mask)
            assert torch.equal(one[:, :, 0], whole[:, :, t]), t
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(whole, ref, atol=1e-5, rtol=1e-5)


def rollout_rows(model, prompts, dtype, temperature=1.0, new=24):
    """Engine rollouts (invariant ops, the reference forward) and the trainer's log-probs of the same tokens."""
    with batch_invariant(), amp(dtype), torch.no_grad():
        res = Engine(model, fast=False).generate(prompts, max_new_tokens=new, temperature=temperature, seed=3,
                                                 logprobs=True, stop_ids=[])  # fmt: skip
    rows = [p + t for p, t in zip(prompts, res.tokens)]
    L = max(map(len, rows)) - 1
    ids, tgt = torch.zeros(len(rows), L, dtype=torch.long), torch.zeros(len(rows), L, dtype=torch.long)
    for i, r in enumerate(rows):  # right-padded, as posttrain/sample.collate lays rollouts out
        ids[i, : len(r) - 1], tgt[i, : len(r) - 1] = torch.tensor(r[:-1]), torch.tensor(r[1:])
    return res, ids, tgt


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_engine_logprobs_equal_the_trainers_bit_for_bit(dtype):
    model = tiny_moe()
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(3, 512, (n,), generator=g).tolist() for n in (5, 17, 40, 9, 33)]
    res, ids, tgt = rollout_rows(model, prompts, dtype)
    for rows in ([0, 1, 2, 3, 4], [2], [4, 0]):  # micro-batches of other sizes and orders than the rollout batch
        with batch_invariant(), amp(dtype), torch.no_grad():
            lp = token_logprobs(model(ids[rows]).logits.float(), tgt[rows], 1.0)
        for j, i in enumerate(rows):
            P, n = len(prompts[i]), len(res.tokens[i])
            assert torch.equal(lp[j, P - 1 : P - 1 + n], torch.tensor(res.logprobs[i])), (dtype, rows, i)


def test_invariant_forward_and_backward_are_the_plain_ones():
    model = tiny_moe()
    ids = torch.randint(3, 512, (3, 45), generator=torch.Generator().manual_seed(4))
    grads = []
    for on in (False, True):
        model.zero_grad()
        with batch_invariant(on):
            out = model(ids, labels=ids)
        out.loss.backward()
        grads.append((out.logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (la, ga), (lb, gb) = grads
    torch.testing.assert_close(lb, la, atol=1e-4, rtol=1e-4)
    assert ga.keys() == gb.keys()
    for n in ga:
        torch.testing.assert_close(gb[n], ga[n], atol=1e-4, rtol=1e-3, msg=n)


def test_the_switch_is_scoped():
    assert not invariant.enabled()
    with batch_invariant():
        assert invariant.enabled()
        with batch_invariant(False):
            assert not invariant.enabled()
        assert invariant.enabled()
    assert not invariant.enabled()


def test_packed_segments_are_refused():
    from glmstack.model.attention import segment_mask

    q = k = v = torch.randn(1, 2, 6, 8)
    with batch_invariant(), pytest.raises(ValueError, match="packed segments"):
        invariant.attention(q, k, v, segment_mask(torch.tensor([[1, 1, 1, 2, 2, 2]])))
