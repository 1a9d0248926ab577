"""posttrain/sample.py: the one layout every RL path trains on (hypothesis over random single- and multi-turn
samples): each masked position's target is a sampled token with its own rollout log-prob, nothing else is masked."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from glmstack.posttrain.sample import Sample, collate

turn = st.tuples(st.lists(st.integers(2, 50), min_size=1, max_size=5), st.booleans())  # (ids, sampled?)


@settings(deadline=None)
@given(st.lists(st.lists(turn, min_size=1, max_size=4), min_size=1, max_size=5))
def test_masked_targets_are_exactly_the_sampled_tokens(episodes):
    samples = []
    for e, turns in enumerate(episodes):
        tokens, mask, logp = [1], [0], [0.0]  # a one-token prompt: the first token is never a target
        for ids, sampled in turns:
            tokens += ids
            mask += [int(sampled)] * len(ids)
            logp += [-(e + 1) - 0.01 * t if sampled else 0.0 for t in ids]
        samples.append(Sample(tokens=tokens, loss_mask=mask, rollout_logp=logp))
    b = collate(samples, torch.zeros(len(samples)))
    L = max(len(s.tokens) for s in samples) - 1
    assert b["input_ids"].shape == b["targets"].shape == b["mask"].shape == (len(samples), L)
    for i, s in enumerate(samples):
        want = [(t, lp) for t, m, lp in zip(s.tokens[1:], s.loss_mask[1:], s.rollout_logp[1:]) if m]
        m = b["mask"][i] > 0
        got = list(zip(b["targets"][i][m].tolist(), b["rollout_logp"][i][m].tolist()))
        assert [t for t, _ in got] == [t for t, _ in want]
        torch.testing.assert_close(torch.tensor([lp for _, lp in got]), torch.tensor([lp for _, lp in want]))
        assert b["input_ids"][i, : len(s.tokens) - 1].tolist() == s.tokens[:-1]


def test_single_turn_and_misaligned_samples():
    s = Sample.single_turn([5, 6], [7, 8], [-0.5, -0.25])
    assert s.loss_mask == [0, 0, 1, 1] and s.rollout_logp == [0.0, 0.0, -0.5, -0.25]
    try:
        Sample(tokens=[1, 2], loss_mask=[0], rollout_logp=[0.0, 0.0])
    except ValueError as e:
        assert "must line up" in str(e)
    else:
        raise AssertionError("misaligned sample accepted")


def test_routes_align_with_input_ids_and_pad_with_minus_one():
    r1 = torch.arange(4 * 2 * 3, dtype=torch.int16).view(4, 2, 3)  # engine routes: 5 tokens -> seq_len - 1 = 4
    a = Sample.single_turn([5, 6, 7], [8, 9], [-0.5, -0.25], routes=r1)
    b = Sample.single_turn([5], [8, 9], [-0.5, -0.25])  # no record (e.g. a refill from another path)
    batch = collate([a, b, Sample.single_turn([1, 2], [3], [-1.0], routes=r1[:2])], torch.zeros(3))
    routes = batch["routes"]
    assert routes.dtype == torch.long and routes.shape == (3, 4, 2, 3)
    assert torch.equal(routes[0], r1.long())  # position t = the routing of input token t
    assert torch.all(routes[1] == -1) and torch.equal(routes[2, :2], r1[:2].long()) and torch.all(routes[2, 2:] == -1)
    assert "routes" not in collate([b], torch.zeros(1))
