"""Encoded conversations -> packed SFT batches with document masks, reshuffled every epoch, resumable exactly.

What: `PackedSFT(examples, seq_len=, batch_size=, seed=)` is an infinite iterable of batches
    {"input_ids", "labels", "position_ids", "segment_ids"}: (B, T) int64 each
where `labels[t]` is the next token when that token is trained (its `chat.encode` mask is 1) and -100 otherwise.

How: epoch e takes the conversations in a permutation seeded by (seed, e), packs them best-fit-decreasing into rows
of `seq_len` (glmstack.data.packing; GLM-4.5 §2.3 packs the same way), and shuffles the rows. Segment ids number
the conversations of a row, so attention and MTP targets never cross conversations and a packed batch's loss is
the token-weighted loss of its conversations run alone (tests/unit/test_sft_packing.py). Rows form one stream over
the epochs; batch i of rank r is rows [(i·world + r)·B, ...) of it, a pure function of (seed, i), so
`state_dict()` = {"global_batches": i·world} resumes bit for bit, on any number of ranks dividing it. Conversations longer than `seq_len` are dropped (counted in
`dropped_long`): cutting one would train on an assistant turn without its end.
"""

from __future__ import annotations

import numpy as np
import torch

from glmstack.data.packing import pack, row_arrays
from glmstack.data.position import GlobalBatchPosition


class PackedSFT(GlobalBatchPosition):
    def __init__(self, examples: list[tuple[list[int], list[int]]], *, seq_len: int, batch_size: int, seed: int = 0,
                 rank: int = 0, world_size: int = 1, buffer: int = 1 << 14, shuffle: bool = True, pad_id: int = 0):  # fmt: skip
        kept = [(np.asarray(i, np.int64), np.asarray(m, np.int64)) for i, m in examples if len(i) <= seq_len]
        self.dropped_long = len(examples) - len(kept)
        if not kept:
            raise ValueError(f"no conversation fits in seq_len={seq_len} ({len(examples)} given)")
        self.examples = kept
        self.seq_len, self.batch_size, self.seed = seq_len, batch_size, seed
        self.rank, self.world_size, self.buffer, self.shuffle, self.pad_id = rank, world_size, buffer, shuffle, pad_id
        self.position = 0
        self._epochs: dict[int, list] = {}  # epoch -> its rows (the last two are kept)
        self._starts = [0]  # _starts[e] = index of epoch e's first row in the stream

    # ---------------------------------------------------------------- rows
    def epoch_rows(self, epoch: int) -> list[list[tuple[int, int, int]]]:
        """Rows of (conversation, 0, length) for one epoch: permuted, packed best-fit, rows shuffled."""
        if epoch not in self._epochs:
            rng = np.random.default_rng([self.seed, epoch])
            order = rng.permutation(len(self.examples)) if self.shuffle else np.arange(len(self.examples))
            rows = pack([len(self.examples[i][0]) for i in order], self.seq_len, self.buffer)
            rows = [[(int(order[d]), s, n) for d, s, n in row] for row in rows]
            if self.shuffle:
                rows = [rows[i] for i in rng.permutation(len(rows))]
            self._epochs[epoch] = rows
            for old in [e for e in self._epochs if e < epoch - 1]:
                del self._epochs[old]
        return self._epochs[epoch]

    def row(self, k: int) -> list[tuple[int, int, int]]:
        """The k-th row of the stream over all epochs."""
        while self._starts[-1] <= k:
            e = len(self._starts) - 1
            self._starts.append(self._starts[-1] + len(self.epoch_rows(e)))
        e = int(np.searchsorted(self._starts, k, side="right")) - 1
        return self.epoch_rows(e)[k - self._starts[e]]

    # ---------------------------------------------------------------- batches
    def row_tensors(self, row) -> dict[str, np.ndarray]:
        ids = row_arrays(row, lambda d, s, n: self.examples[d][0][s : s + n], self.seq_len, self.pad_id)
        trained = row_arrays(row, lambda d, s, n: self.examples[d][1][s : s + n], self.seq_len, 0)["input_ids"]
        next_trained = np.append(trained[1:], 0)  # label t predicts token t+1: it counts if token t+1 is trained
        ids["labels"] = np.where(next_trained == 1, ids["labels"], -100)
        return ids

    def batch(self, index: int) -> dict[str, torch.Tensor]:
        first = (index * self.world_size + self.rank) * self.batch_size
        rows = [self.row_tensors(self.row(first + b)) for b in range(self.batch_size)]
        return {k: torch.from_numpy(np.stack([r[k] for r in rows])) for k in rows[0]}  # (B, T) each

    def trained_tokens(self) -> int:
        return int(sum(m.sum() for _, m in self.examples))
