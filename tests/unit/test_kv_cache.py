"""KVCache: incremental attention through the cache equals full causal attention; padding and per-row rewind."""

import pytest
import torch
import torch.nn.functional as F

from glmstack.inference.kv_cache import KVCache

B, H, D = 3, 2, 8


def attend(cache, i, q, k, v):
    """Attention the way a model layer uses the cache contract."""
    k_all, v_all = cache.update(i, k, v)
    mask = cache.attention_mask(i, q.shape[2])
    if mask is None:
        return F.scaled_dot_product_attention(q, k_all, v_all, is_causal=q.shape[2] > 1)
    return F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask)


def full(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def rand(T, b=B, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, H, T, D, generator=g) for _ in range(3)]


def test_prefill_then_decode_equals_full():
    q, k, v = rand(7)
    cache = KVCache(B, 16)
    outs = [attend(cache, 0, q[:, :, :4], k[:, :, :4], v[:, :, :4])]
    for t in range(4, 7):  # one token at a time
        outs.append(attend(cache, 0, q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1]))
    torch.testing.assert_close(torch.cat(outs, 2), full(q, k, v))
    assert cache.seq_len == 7 and cache.lengths(0).tolist() == [7, 7, 7]


def test_block_after_prefix_uses_offset_causal_mask():
    q, k, v = rand(6)
    cache = KVCache(B, 8)
    attend(cache, 0, q[:, :, :2], k[:, :, :2], v[:, :, :2])
    out = attend(cache, 0, q[:, :, 2:], k[:, :, 2:], v[:, :, 2:])  # 4 queries after 2 stored keys
    torch.testing.assert_close(out, full(q, k, v)[:, :, 2:])


def test_left_padding_matches_unpadded_row():
    q, k, v = rand(5, b=1)
    pad = 3
    qp, kp, vp = (torch.cat([torch.randn(1, H, pad, D), x], 2) for x in (q, k, v))  # garbage in the pad
    cache = KVCache(1, 10, start=torch.tensor([pad]))
    out = attend(cache, 0, qp[:, :, :6], kp[:, :, :6], vp[:, :, :6])
    out2 = attend(cache, 0, qp[:, :, 6:], kp[:, :, 6:], vp[:, :, 6:])
    torch.testing.assert_close(torch.cat([out, out2], 2)[:, :, pad:], full(q, k, v))


def test_per_row_rewind_forgets_dropped_positions():
    q, k, v = rand(6)
    junk = rand(3, seed=1)
    cache = KVCache(B, 12)
    attend(cache, 0, q[:, :, :3], k[:, :, :3], v[:, :, :3])
    attend(cache, 0, *junk)  # speculative block; rows keep 0, 1, 3 of it
    keep = torch.tensor([0, 1, 3])
    cache.rewind(3 - keep)
    assert cache.lengths(0).tolist() == [3, 4, 6] and cache.length(0) == 6
    # rewrite the rows so that they hold the real tokens 3..5 after the kept junk; compare row 0 to full
    out = attend(cache, 0, q[:, :, 3:6], k[:, :, 3:6], v[:, :, 3:6])
    torch.testing.assert_close(out[0], full(q, k, v)[0, :, 3:6])
    # row 2 kept all junk: its queries see prefix + junk + its own block
    kj = torch.cat([k[2:, :, :3], junk[1][2:], k[2:, :, 3:6]], 2)
    vj = torch.cat([v[2:, :, :3], junk[2][2:], v[2:, :, 3:6]], 2)
    qj = torch.cat([q[2:, :, :3], junk[0][2:], q[2:, :, 3:6]], 2)
    torch.testing.assert_close(out[2], full(qj, kj, vj)[0, :, 6:9])


def test_layers_have_independent_lengths_and_shapes():
    cache = KVCache(2, 8)
    cache.update(0, torch.zeros(2, 4, 3, 16), torch.zeros(2, 4, 3, 16))
    lat, rope = cache.update(5, torch.ones(2, 1, 2, 32), torch.ones(2, 1, 2, 4))  # MLA-like shapes
    assert lat.shape == (2, 1, 2, 32) and rope.shape == (2, 1, 2, 4)
    assert cache.length(0) == 3 and cache.length(5) == 2 and cache.seq_len == 3


def test_overflow_and_bad_rewind_raise():
    cache = KVCache(1, 4)
    cache.update(0, torch.zeros(1, 1, 4, 2), torch.zeros(1, 1, 4, 2))
    with pytest.raises(ValueError, match="full"):
        cache.update(0, torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1, 2))
    with pytest.raises(ValueError, match="below zero"):
        cache.rewind(5)


def test_keep_rows_continues_like_the_kept_rows_alone():
    q, k, v = rand(6)
    cache = KVCache(B, 8, start=torch.tensor([0, 2, 1]))
    attend(cache, 0, q[:, :, :4], k[:, :, :4], v[:, :, :4])
    cache.keep_rows(torch.tensor([2, 0]))
    assert cache.batch_size == 2 and cache.start.tolist() == [1, 0]
    out = attend(cache, 0, q[[2, 0], :, 4:], k[[2, 0], :, 4:], v[[2, 0], :, 4:])
    ref = KVCache(B, 8, start=torch.tensor([0, 2, 1]))
    attend(ref, 0, q[:, :, :4], k[:, :, :4], v[:, :, :4])
    torch.testing.assert_close(out, attend(ref, 0, q[:, :, 4:], k[:, :, 4:], v[:, :, 4:])[[2, 0]])


def test_long_speculative_history_keeps_sharing_masks():
    """Thousands of verify-block updates + rewinds: mask lookups stay cheap (the signature used to be a tuple
    nested once per update and hit Python's recursion limit after ~1000 steps), layers with the same history
    still share one mask, and the mask is still right."""
    q, k, v = rand(3)
    cache = KVCache(B, 16, start=torch.tensor([0, 1, 2]))
    for _ in range(3000):
        for i in (0, 1):
            cache.update(i, k, v)
        assert cache.attention_mask(0, 3) is cache.attention_mask(1, 3)
        cache.rewind(3)
    ref = KVCache(B, 16, start=torch.tensor([0, 1, 2]))
    assert torch.equal(attend(cache, 0, q, k, v), attend(ref, 0, q, k, v))


def test_append_rows_and_drop_front_keep_each_row_exact():
    """Continuous batching: rows prefilled apart, joined (right-aligned), decoded together, one leaves, the front is
    reclaimed; each row's attention output equals full causal attention over its own tokens."""
    q1, k1, v1 = rand(7, b=1, seed=1)  # row A: 5-token prompt, 2 decode steps
    q2, k2, v2 = rand(6, b=1, seed=2)  # row B: 2-token prompt, 4 decode steps
    a, b = KVCache(1, 5), KVCache(1, 2)
    out_a = [attend(a, 0, q1[:, :, :5], k1[:, :, :5], v1[:, :, :5])]
    out_b = [attend(b, 0, q2[:, :, :2], k2[:, :, :2], v2[:, :, :2])]
    run = KVCache(0, 8)
    run.append_rows(a)
    run.append_rows(b)
    assert run.start.tolist() == [0, 3] and run.seq_len == 5 and run.batch_size == 2
    for t in range(2):
        step = [
            torch.cat([x1[:, :, 5 + t : 6 + t], x2[:, :, 2 + t : 3 + t]]) for x1, x2 in ((q1, q2), (k1, k2), (v1, v2))
        ]
        o = attend(run, 0, *step)
        out_a.append(o[:1])
        out_b.append(o[1:])
    run.keep_rows(torch.tensor([1]))  # A leaves
    assert run.drop_front() == 3 and run.seq_len == 4 and run.start.tolist() == [0]
    for t in range(4, 6):
        out_b.append(attend(run, 0, q2[:, :, t : t + 1], k2[:, :, t : t + 1], v2[:, :, t : t + 1]))
    torch.testing.assert_close(torch.cat(out_a, 2), full(q1, k1, v1))
    torch.testing.assert_close(torch.cat(out_b, 2), full(q2, k2, v2))
