"""Data position by global sample (issue 27): a run stopped on W ranks and resumed on W' ranks consumes exactly the
samples the uninterrupted W-rank run consumes — none skipped, none repeated (as a multiset, since the ranks' order
of rows within a step differs). Resumed on 1 rank (2 micro-batches a step, the same global batch) and on 4 ranks."""

from collections import Counter

import numpy as np
import pytest

from glmstack.data.loader import PackedLoader, PretrainLoader
from glmstack.data.shards import ShardWriter
from glmstack.train.markov_stream import SyntheticLM

B = 2  # rows per micro-batch


def _shards(tmp_path):
    w = ShardWriter(tmp_path, 300, eos_id=0, vocab_size=10_000)
    next_id = 1
    for n in np.random.default_rng(0).integers(3, 40, size=120):  # distinct ids: every row is traceable
        w.add(list(range(next_id, next_id + int(n) - 1)) + [0])
        next_id += int(n) - 1
    w.close()


def _loaders(kind, tmp_path, world):
    if kind == "synthetic":
        return [SyntheticLM(vocab_size=1000, seq_len=8, batch_size=B, rank=r, world_size=world) for r in range(world)]
    cls = {"concat": PretrainLoader, "best_fit": PackedLoader}[kind]
    return [cls(tmp_path, seq_len=16, batch_size=B, rank=r, world_size=world, seed=5) for r in range(world)]


def _take(loaders, steps, accum=1) -> list[tuple]:
    """Rows consumed by `steps` optimizer steps of `accum` micro-batches on every rank."""
    its = [iter(x) for x in loaders]
    return [tuple(row.tolist()) for _ in range(steps * accum) for it in its for row in next(it)["input_ids"]]


@pytest.mark.parametrize("kind", ["synthetic", "concat", "best_fit"])
def test_resume_on_another_world_size_consumes_the_same_samples(tmp_path, kind):
    if kind != "synthetic":
        _shards(tmp_path)
    want = Counter(_take(_loaders(kind, tmp_path, 2), 8))  # 2 ranks, 8 steps: 32 rows, inside the first epoch
    if kind != "synthetic":
        assert _loaders(kind, tmp_path, 2)[0].batches_per_epoch >= 8
    for world, steps, accum in ((1, 4, 2), (4, 2, 1)):  # the 4 remaining steps' 16 rows
        first = _loaders(kind, tmp_path, 2)
        consumed = _take(first, 4)
        states = [x.state_dict() for x in first]
        assert states[0] == states[1]  # one global position, whichever rank's file is read
        resumed = _loaders(kind, tmp_path, world)
        for x in resumed:
            x.load_state_dict(states[0])
        consumed += _take(resumed, steps, accum)
        assert Counter(consumed) == want, (kind, world)


def test_a_position_no_global_batch_continues_is_refused():
    a = SyntheticLM(vocab_size=100, seq_len=8, batch_size=B, rank=0, world_size=2)
    next(iter(a))  # 2 global batches consumed
    b = SyntheticLM(vocab_size=100, seq_len=8, batch_size=B, rank=0, world_size=4)
    with pytest.raises(ValueError, match="cannot continue evenly"):
        b.load_state_dict(a.state_dict())
