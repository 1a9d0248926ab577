"""A synthetic token stream that follows the data-batches contract, for tests, benchmarks and smoke runs.

Sequences are walks on a fixed random sparse Markov chain (each token has `branching` likely successors), so a
small model can learn them and the loss falls quickly; batch i of rank r is a pure function of (seed, r, i),
which makes the position (`state_dict`, counted in global batches) exact and resumable on any number of ranks and keeps
ranks disjoint.

    data = SyntheticLM(vocab_size=512, seq_len=64, batch_size=4, rank=0, world_size=1)
    batch = next(iter(data))   # {"input_ids": (B, T), "labels": (B, T) already shifted}
"""

from __future__ import annotations

import torch

from glmstack.data.position import GlobalBatchPosition


class SyntheticLM(GlobalBatchPosition):
    """Infinite iterable of {"input_ids", "labels"} batches; state_dict() = {"global_batches": consumed by all}."""

    def __init__(
        self,
        *,
        vocab_size: int,
        seq_len: int,
        batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        branching: int = 4,
        split: str = "train",
        reserved_ids: int = 0,
    ):
        """reserved_ids: the top ids of the vocabulary never appear in the text (special tokens of a transform,
        e.g. blank infilling's [MASK] ... <eop>); 0 = the whole vocabulary (the default stream)."""
        self.vocab_size, self.seq_len, self.batch_size = vocab_size, seq_len, batch_size
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.stream = 0 if split == "train" else 1  # validation draws from a disjoint stream
        self.position = 0
        g = torch.Generator().manual_seed(seed)  # the chain itself is shared by every rank and split
        self.n_text = vocab_size - reserved_ids  # ids that appear in the text
        self.successors = torch.randint(0, self.n_text, (vocab_size, branching), generator=g)  # (V, k)

    def batch(self, index: int) -> dict[str, torch.Tensor]:
        """The `index`-th batch of this rank (pure in seed, rank, index)."""
        global_index = index * self.world_size + self.rank  # rank r takes every world_size-th batch
        mix = (self.seed * 1_000_003 + self.stream) * 2_147_483_629 + global_index  # same on every Python/platform
        g = torch.Generator().manual_seed(mix % (2**63))
        B, T = self.batch_size, self.seq_len
        tokens = torch.empty(B, T + 1, dtype=torch.long)
        tokens[:, 0] = torch.randint(0, self.n_text, (B,), generator=g)
        choice = torch.randint(0, self.successors.shape[1], (B, T), generator=g)
        for t in range(T):
            tokens[:, t + 1] = self.successors[tokens[:, t], choice[:, t]]
        return {"input_ids": tokens[:, :-1].contiguous(), "labels": tokens[:, 1:].contiguous()}  # (B, T) each
