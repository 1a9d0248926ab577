"""Packing and loaders: best-fit properties, fewer truncations than concatenation, masks, one pass per epoch,
exact resume, disjoint data-parallel ranks."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from glmstack.data.loader import PackedLoader, PretrainLoader
from glmstack.data.packing import best_fit_decreasing, document_mask, pack, truncation_report
from glmstack.data.shards import ShardWriter, TokenShards

EOS = 0


def test_paper_example():
    # Ding et al. Fig. 1: documents of 14, 7, 5, 2, 3 tokens, rows of 8 -> only the 14-token one is cut
    rows = pack([14, 7, 5, 2, 3], 8)
    assert sorted(sorted(c[2] for c in r) for r in rows) == [[2, 6], [3, 5], [7], [8]]
    assert truncation_report([14, 7, 5, 2, 3], 8)["best_fit_truncated"] == 0.2


@settings(max_examples=100, deadline=None)
@given(lengths=st.lists(st.integers(1, 64), min_size=1, max_size=200), cap=st.integers(64, 100))
def test_best_fit_properties(lengths, cap):
    bins = best_fit_decreasing(lengths, cap)
    flat = sorted(i for b in bins for i in b)
    assert flat == list(range(len(lengths)))  # every chunk exactly once, none split
    assert all(sum(lengths[i] for i in b) <= cap for b in bins)
    assert len(bins) <= 2 * sum(lengths) / cap + 1


@settings(max_examples=100, deadline=None)
@given(
    docs=st.lists(st.tuples(st.integers(1, 300), st.sampled_from([0, 5])), min_size=1, max_size=100),
    cap=st.integers(64, 100),
)
def test_pack_keeps_room_beside_each_chunk(docs, cap):
    """Room for sampling-time FIM: each chunk of a document with room r holds <= cap - r tokens, the chunks
    cover the document exactly, and every row still fits its chunks plus their room."""
    lengths, room = [n for n, _ in docs], [r for _, r in docs]
    rows = pack(lengths, cap, room=room)
    chunks = sorted(c for r in rows for c in r)
    for d, n in enumerate(lengths):
        mine = [c for c in chunks if c[0] == d]
        assert [c[1] for c in mine] == list(range(0, n, cap - room[d])) and sum(c[2] for c in mine) == n
    assert all(sum(n + room[d] for d, _, n in r) <= cap for r in rows)


def test_best_fit_truncates_fewer_than_concatenation():
    rng = np.random.default_rng(0)
    lengths = list(rng.integers(20, 600, size=500))
    rep = truncation_report(lengths, 512)
    assert rep["best_fit_truncated"] < rep["concat_truncated"]


def _shards(tmp_path, lengths, shard_tokens=300):
    w = ShardWriter(tmp_path, shard_tokens, eos_id=EOS, vocab_size=10_000)
    next_id = 1
    for n in lengths:  # distinct ids so every token can be traced; each document ends with EOS
        w.add(list(range(next_id, next_id + n - 1)) + [EOS])
        next_id += n - 1
    w.close()
    return TokenShards(tmp_path)


def test_shards_roundtrip_across_files(tmp_path):
    sh = _shards(tmp_path, [50, 260, 10, 400])
    assert len(sh.meta["shards"]) > 1 and sh.n_docs == 4
    assert [len(sh.doc(i)) for i in range(4)] == [50, 260, 10, 400]
    assert sh.doc(3)[-1] == EOS and sh.span(0, sh.n_tokens).tolist()[:3] == [1, 2, 3]


def test_pretrain_windows_shift_and_cover_each_token_once(tmp_path):
    sh = _shards(tmp_path, [37] * 20)  # 740 tokens
    L = 16
    loader = PretrainLoader(tmp_path, seq_len=L, batch_size=2, max_epochs=1)
    seen = []
    for b in loader:
        assert b["input_ids"].shape == (2, L) and b["input_ids"].dtype.is_floating_point is False
        assert (b["input_ids"][:, 1:] == b["labels"][:, :-1]).all()
        seen += b["input_ids"].flatten().tolist()
    n_windows = (sh.n_tokens - 1) // L  # 46 windows = 23 full batches: nothing is left over
    assert len(seen) == n_windows * L
    assert sorted(seen) == sorted(sh.span(0, n_windows * L).tolist())  # each token an input exactly once


def test_packed_rows_masks_and_one_pass(tmp_path):
    lengths = [5, 9, 30, 3, 12, 7, 16, 2, 40]
    sh = _shards(tmp_path, lengths)
    L = 16
    loader = PackedLoader(tmp_path, seq_len=L, batch_size=1, max_epochs=1, shuffle=False)
    tokens = []
    for b in loader:
        ids, labels = b["input_ids"][0], b["labels"][0]
        seg, pos = b["segment_ids"][0], b["position_ids"][0]
        for k in seg.unique().tolist():
            m = seg == k
            if k == 0:  # padding: no loss
                assert (labels[m] == -100).all()
                continue
            idx = m.nonzero().flatten()
            assert (idx == torch_arange(idx[0], idx[-1] + 1)).all()  # contiguous segment
            assert pos[m].tolist() == list(range(int(m.sum())))  # positions restart per document
            assert labels[idx[-1]] == -100  # no target across the boundary
            assert (labels[idx[:-1]] == ids[idx[1:]]).all()
            tokens += ids[m].tolist()
        mask = document_mask(seg.numpy())
        assert not mask[seg.numpy() == 1][:, seg.numpy() == 2].any()
    assert sorted(tokens) == sorted(sh.span(0, sh.n_tokens).tolist())  # every token exactly once per epoch


def torch_arange(a, b):
    import torch

    return torch.arange(int(a), int(b))


@pytest.mark.parametrize("cls", [PretrainLoader, PackedLoader])
def test_resume_is_exact(tmp_path, cls):
    _shards(tmp_path, list(np.random.default_rng(0).integers(3, 40, size=60)))
    a = cls(tmp_path, seq_len=16, batch_size=2, seed=3)
    it = iter(a)
    for _ in range(5):
        next(it)
    state = a.state_dict()
    expected = [next(it) for _ in range(7)]  # crosses an epoch boundary for the small packed set
    b = cls(tmp_path, seq_len=16, batch_size=2, seed=3)
    b.load_state_dict(state)
    got = [x for _, x in zip(range(7), b)]
    for e, g in zip(expected, got):
        assert all((e[k] == g[k]).all() for k in e)


@pytest.mark.parametrize("cls", [PretrainLoader, PackedLoader])
def test_ranks_are_disjoint_and_cover_the_global_batch(tmp_path, cls):
    _shards(tmp_path, list(np.random.default_rng(1).integers(3, 40, size=80)))
    single = cls(tmp_path, seq_len=16, batch_size=4, seed=0, max_epochs=1)
    ranks = [cls(tmp_path, seq_len=16, batch_size=2, rank=r, world_size=2, seed=0, max_epochs=1) for r in (0, 1)]
    for full, r0, r1 in zip(single, *ranks):
        assert (full["input_ids"] == np.concatenate([r0["input_ids"], r1["input_ids"]])).all()
