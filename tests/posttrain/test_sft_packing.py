"""Packing changes nothing: a packed SFT batch's loss (LM + MTP) and gradients equal the token-weighted loss of its
conversations run alone, within 1e-5; the packed stream resumes exactly and reshuffles per epoch."""

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from glmstack.model import load_hf
from glmstack.model.mtp import mtp_targets
from glmstack.posttrain.packed import PackedSFT
from glmstack.posttrain.sft_data import encode_record
from glmstack.posttrain.synthetic import generate

MTP_WEIGHT = 0.3


def examples(tok, n=6):
    recs = generate("arithmetic", n // 2) + generate("chat", n - n // 2)
    return [encode_record(tok, r, "glm-4.5") for r in recs]


def loss_parts(model, batch):
    out = model(batch["input_ids"], labels=batch["labels"], position_ids=batch.get("position_ids"),
                segment_ids=batch.get("segment_ids"), mtp_weight=MTP_WEIGHT, aux_loss_weight=0.0)  # fmt: skip
    _, mtp_labels = mtp_targets(batch["input_ids"], batch["labels"], 1, batch.get("segment_ids"))
    return out, int((batch["labels"] != -100).sum()), int((mtp_labels != -100).sum())


def test_packed_loss_and_grads_equal_conversations_alone(base_dir, tok):
    model = load_hf(base_dir)
    exs = examples(tok)
    n_rows = len(PackedSFT(exs, seq_len=256, batch_size=1, shuffle=False).epoch_rows(0))
    data = PackedSFT(exs, seq_len=256, batch_size=n_rows, shuffle=False)  # one batch = every conversation once
    assert n_rows < len(exs)  # rows hold several conversations
    out, _, _ = loss_parts(model, data.batch(0))
    out.loss.backward()
    packed = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()

    lm_sum, mtp_sum, n_lm, n_mtp = 0.0, 0.0, 0, 0
    for ids, mask in exs:  # each conversation alone: one row of exactly its length, no segments
        alone = PackedSFT([(ids, mask)], seq_len=len(ids), batch_size=1, shuffle=False).batch(0)
        del alone["segment_ids"], alone["position_ids"]
        o, n1, n2 = loss_parts(model, alone)
        lm_sum, mtp_sum = lm_sum + o.lm_loss * n1, mtp_sum + o.mtp_loss[0] * n2
        n_lm, n_mtp = n_lm + n1, n_mtp + n2
    expected = lm_sum / n_lm + MTP_WEIGHT * mtp_sum / n_mtp  # token-weighted over the conversations
    expected.backward()
    assert abs(out.loss.item() - expected.item()) < 1e-5
    for n, p in model.named_parameters():
        if n in packed:
            torch.testing.assert_close(packed[n], p.grad, atol=1e-5, rtol=1e-4, msg=n)


def test_labels_follow_the_mask_and_segments(tok):
    exs = examples(tok, 4)
    n_rows = len(PackedSFT(exs, seq_len=256, batch_size=1, shuffle=False).epoch_rows(0))
    b = PackedSFT(exs, seq_len=256, batch_size=n_rows, shuffle=False).batch(0)
    ids, labels, seg = (b[k].flatten() for k in ("input_ids", "labels", "segment_ids"))
    trained = sum(sum(m[1:]) for _, m in exs)  # every trained token but a first one is some position's label
    assert int((labels != -100).sum()) == trained
    for t in torch.nonzero(labels != -100).flatten().tolist():
        assert labels[t] == ids[t + 1] and seg[t] == seg[t + 1] > 0


def test_stream_resumes_exactly_and_reshuffles(tok):
    exs = examples(tok, 12)
    a = PackedSFT(exs, seq_len=128, batch_size=2, seed=3)
    first = [next(iter(a)) for _ in range(7)]
    b = PackedSFT(exs, seq_len=128, batch_size=2, seed=3)
    b.load_state_dict({"position": 4})
    for want, got in zip(first[4:], [next(iter(b)) for _ in range(3)]):
        assert all(torch.equal(want[k], got[k]) for k in want)
    assert a.epoch_rows(0) != a.epoch_rows(1)  # a new permutation every epoch
    assert sorted(d for r in a.epoch_rows(0) for d, _, _ in r) == sorted(d for r in a.epoch_rows(1) for d, _, _ in r)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=30), st.integers(0, 5), st.integers(1, 3))
def test_every_conversation_once_per_epoch_with_its_trained_labels_property(lengths, seed, batch):
    rng = np.random.default_rng(seed)
    exs = [(rng.integers(1, 100, n).tolist(), rng.integers(0, 2, n).tolist()) for n in lengths]
    data = PackedSFT(exs, seq_len=40, batch_size=batch, seed=seed)
    for epoch in (0, 1):
        rows = data.epoch_rows(epoch)
        assert sorted(d for r in rows for d, _, _ in r) == list(range(len(exs)))
        assert all(sum(n for _, _, n in r) <= 40 for r in rows)
    b = data.batch(0)
    for row_ids, labels, seg in zip(b["input_ids"], b["labels"], b["segment_ids"]):
        for k in set(seg.tolist()) - {0}:
            at = (seg == k).nonzero().flatten()
            ids = row_ids[at].tolist()
            matches = [d for d, (i, _) in enumerate(exs) if i == ids]
            if len(matches) != 1:
                continue  # identical random conversations with different masks: ambiguous
            doc = matches[0]
            want = [t if m else -100 for t, m in zip(exs[doc][0][1:], exs[doc][1][1:])] + [-100]
            assert labels[at].tolist() == want
