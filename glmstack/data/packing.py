"""Packing documents into fixed-length rows: concatenation (pre-training) and best-fit-decreasing (mid-training).

GLM-4.5 §2.3: pre-training concatenates documents and cuts at the context length ("random truncation");
mid-training uses best-fit packing (Ding et al. 2024, "Fewer Truncations Improve Language Modeling", arXiv
2404.10830) so that reasoning traces and repo-level code are not cut:
  1. chunk: a document longer than the row is split into row-sized chunks plus a remainder (the only cut left);
  2. pack: chunks sorted longest first, each goes into the open row whose free space is the SMALLEST that still
     fits it, else a new row. Chunks are never split.
Rows are packed within buffers of `buffer` chunks (the paper's memory/density trade-off). The sorted list of
free capacities makes "smallest free space >= n" a bisect; the paper's segment tree would make it O(log L).
"""

from __future__ import annotations

import bisect

import numpy as np


def chunk_lengths(lengths: list[int], capacity: int, room: list[int] | None = None) -> list[tuple[int, int, int]]:
    """(doc, start, length) chunks of at most `capacity - room[doc]` tokens, in document order."""
    out = []
    for d, n in enumerate(lengths):
        step = capacity - (room[d] if room else 0)
        for start in range(0, n, step):
            out.append((d, start, min(step, n - start)))
    return out


def best_fit_decreasing(lengths: list[int], capacity: int) -> list[list[int]]:
    """Bins (lists of item indices) with sum(lengths) <= capacity each; deterministic (ties by index)."""
    if any(n <= 0 or n > capacity for n in lengths):
        raise ValueError(f"every length must be in 1..{capacity}; chunk long documents first")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    free: list[tuple[int, int]] = []  # sorted (free space, bin id)
    bins: list[list[int]] = []
    for i in order:
        n = lengths[i]
        k = bisect.bisect_left(free, (n, -1))  # smallest free space >= n
        if k == len(free):
            bins.append([i])
            b, left = len(bins) - 1, capacity - n
        else:
            left0, b = free.pop(k)
            bins[b].append(i)
            left = left0 - n
        if left > 0:
            bisect.insort(free, (left, b))
    return bins


def pack(
    lengths: list[int], capacity: int, buffer: int = 1 << 16, room: list[int] | None = None
) -> list[list[tuple[int, int, int]]]:
    """Rows of (doc, start, length) chunks: chunk, then best-fit-decreasing within buffers of chunks. `room[doc]`
    tokens are kept free beside each chunk of that document (what sampling-time FIM adds: sentinels)."""
    chunks = chunk_lengths(lengths, capacity, room)
    rows = []
    for s in range(0, len(chunks), buffer):
        part = chunks[s : s + buffer]
        sizes = [c[2] + (room[c[0]] if room else 0) for c in part]
        rows += [[part[i] for i in b] for b in best_fit_decreasing(sizes, capacity)]
    return rows


def concat_truncated(lengths: list[int], window: int) -> int:
    """Documents cut by at least one window boundary when the stream is split every `window` tokens."""
    ends = np.cumsum(lengths)
    starts = ends - np.asarray(lengths)
    return int(np.sum(starts // window != (ends - 1) // window))


def truncation_report(lengths: list[int], seq_len: int) -> dict:
    """Fraction of documents cut under concatenation vs best-fit packing, and the rows each needs."""
    n = max(1, len(lengths))
    rows = pack(lengths, seq_len)
    used = sum(lengths)
    return {
        "documents": len(lengths),
        "concat_truncated": concat_truncated(lengths, seq_len) / n,
        "best_fit_truncated": sum(1 for x in lengths if x > seq_len) / n,
        "concat_rows": used // seq_len,
        "best_fit_rows": len(rows),
        "best_fit_fill": used / max(1, len(rows) * seq_len),
    }


def row_arrays(row: list[tuple[int, int, int]], tokens_of, seq_len: int, pad_id: int) -> dict[str, np.ndarray]:
    """input_ids / labels / position_ids / segment_ids for one packed row.

    labels are already shifted (labels[t] = target of position t); the last token of each chunk has no target
    inside its segment and padding has none at all, so both are -100. position_ids restart at 0 per chunk and
    segment_ids number the chunks 1..k (0 = padding), so attention never crosses documents.
    """
    ids = np.full(seq_len, pad_id, dtype=np.int64)
    labels = np.full(seq_len, -100, dtype=np.int64)
    pos = np.zeros(seq_len, dtype=np.int64)
    seg = np.zeros(seq_len, dtype=np.int64)
    t = 0
    for k, (doc, start, n) in enumerate(row, 1):
        toks = tokens_of(doc, start, n)  # n tokens, or what sampling-time FIM made of them (within the room)
        n = len(toks)
        ids[t : t + n] = toks
        labels[t : t + n - 1] = toks[1:]
        pos[t : t + n] = np.arange(n)
        seg[t : t + n] = k
        t += n
    return {"input_ids": ids, "labels": labels, "position_ids": pos, "segment_ids": seg}


def document_mask(segment_ids: np.ndarray) -> np.ndarray:
    """Dense (T, T) bool attention mask (True = attend): same non-padding segment and causal. Reference only."""
    seg = np.asarray(segment_ids)
    same = (seg[:, None] == seg[None, :]) & (seg[:, None] > 0)
    return same & np.tril(np.ones((len(seg), len(seg)), dtype=bool))
