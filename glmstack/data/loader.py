"""Batches for the training loop (docs/CONTRACTS.md "Data batches"), read from token shards.

    loader = PretrainLoader("runs/data/train", seq_len=512, batch_size=8, rank=0, world_size=1, seed=0)
    for batch in loader: ...            # {"input_ids": (B, T) long, "labels": (B, T) long}
    state = loader.state_dict(); loader.load_state_dict(state)   # exact resume

PretrainLoader (GLM-4.5 pre-training): the split is one token stream, cut into windows of seq_len + 1 tokens
that overlap by one; input_ids = window[:-1], labels = window[1:]. Windows are shuffled per epoch by
(seed, epoch), so every token is an input exactly once per epoch (FIM, below, rearranges code fragments
and trims what they outgrow at the window end). Attention is plain causal over the row.

PackedLoader (mid-training): documents are chunked to seq_len and packed best-fit-decreasing (packing.py);
rows carry segment_ids and per-document position_ids, labels are -100 at chunk ends and padding, so a model
honouring segment_ids never attends or predicts across documents.

FIM (fim.py, `ContextFIM`): when the split's index.json carries a FIM config (the data build's `fim_enabled`),
code and repo documents are transformed here, at sampling time, seeded by (document, copy, epoch, offset), with
the tokenizer saved beside the shards (`<data>/tokenizer`, or `tokenizer=`). `fim=False` turns it off.

Data parallelism: each global batch is batch_size * world_size rows of the epoch order, rank r takes rows
[r * batch_size, (r + 1) * batch_size); the remainder of an epoch that does not fill a global batch is skipped
so every rank takes the same number of steps. The position is counted in rows of the epoch order, not per
rank, so a run resumed on W' ranks continues at the first row the W-rank run did not consume.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from glmstack.data.fim import ContextFIM, FIMConfig
from glmstack.data.packing import pack, row_arrays
from glmstack.data.shards import TokenShards


class _EpochLoader:
    """Shared iteration: a per-epoch permutation of the split's rows, cut into global batches across ranks.
    A subclass says how many rows its shards hold (`_count_rows`) and how to read one (`row`)."""

    def __init__(
        self,
        data_dir,
        seq_len: int,
        batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        shuffle: bool = True,
        max_epochs: int | None = None,
        fim: bool | None = None,
        tokenizer=None,
    ):
        self.shards = TokenShards(data_dir)
        self.seq_len = seq_len
        self.fim = _context_fim(self.shards, fim, tokenizer)  # None = no FIM
        n_items = self._count_rows()
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world_size {world_size}")
        self.n_items, self.batch_size, self.rank, self.world_size = n_items, batch_size, rank, world_size
        self.seed, self.shuffle, self.max_epochs = seed, shuffle, max_epochs
        self.batches_per_epoch = n_items // (batch_size * world_size)
        if self.batches_per_epoch == 0:
            raise ValueError(
                f"{n_items} rows cannot fill one global batch of {batch_size} x {world_size}; "
                "use a smaller seq_len / batch_size or build more data"
            )
        self.epoch, self.batch = 0, 0

    def order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.n_items)
        return np.random.default_rng([self.seed, epoch]).permutation(self.n_items)

    def _items(self) -> np.ndarray:
        g = self.batch_size * self.world_size
        start = self.batch * g + self.rank * self.batch_size
        return self.order(self.epoch)[start : start + self.batch_size]

    def _advance(self) -> None:
        self.batch += 1
        if self.batch == self.batches_per_epoch:
            self.epoch, self.batch = self.epoch + 1, 0

    def state_dict(self) -> dict:
        """Position of the NEXT batch in global samples (rows of the epoch order all ranks consumed), so a run
        resumed on another number of ranks sees exactly the rows the old one did not (none skipped or repeated)."""
        return {"epoch": self.epoch, "samples": self.batch * self.batch_size * self.world_size, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        g = self.batch_size * self.world_size
        samples = int(state["samples"]) if "samples" in state else int(state["batch"]) * g  # older: same world
        if samples % g:
            raise ValueError(f"the run consumed {samples} rows of epoch {state['epoch']}, which global batches of "
                             f"{self.batch_size} x {self.world_size} ranks cannot continue evenly; resume on a number "
                             f"of ranks whose global batch divides it")
        self.epoch, self.batch = int(state["epoch"]), samples // g
        self.seed = int(state.get("seed", self.seed))

    def __len__(self) -> int:
        return self.batches_per_epoch

    def __iter__(self):
        """Epochs follow each other; endless unless max_epochs is set (the trainer decides when to stop)."""
        while self.max_epochs is None or self.epoch < self.max_epochs:
            items, epoch = self._items(), self.epoch
            self._advance()
            yield self._collate([self.row(int(i), epoch) for i in items])

    @staticmethod
    def _collate(rows: list[dict]) -> dict[str, torch.Tensor]:
        """Stack rows; a key only some rows carry (a pre-training window FIM left padded has segment_ids) is
        filled with ones — one segment, no padding — in the others."""
        keys = dict.fromkeys(k for r in rows for k in r)
        fill = lambda r, k: r[k] if k in r else np.ones_like(r["input_ids"])
        return {k: torch.from_numpy(np.stack([fill(r, k) for r in rows])) for k in keys}


class PretrainLoader(_EpochLoader):
    """Concatenate and cut: windows of seq_len + 1 tokens -> input_ids / labels shifted by one."""

    def _count_rows(self) -> int:
        return max(0, (self.shards.n_tokens - 1) // self.seq_len)

    def row(self, i: int, epoch: int = 0) -> dict[str, np.ndarray]:
        w = self.shards.span(i * self.seq_len, (i + 1) * self.seq_len + 1)
        if self.fim is None:
            return {"input_ids": w[:-1], "labels": w[1:]}
        w, n = self.fim.window(i * self.seq_len, w, epoch)
        labels = w[1:].copy()
        labels[max(0, n - 1) :] = -100  # the padding after a window that FIM made shorter predicts nothing
        row = {"input_ids": w[:-1], "labels": labels}
        if n < self.seq_len:  # segment 0 = padding: routed, but not counted in the balancing load or aux loss
            row["segment_ids"] = (np.arange(self.seq_len) < n).astype(np.int64)
        return row


class PackedLoader(_EpochLoader):
    """Best-fit-decreasing packed rows with segment_ids and position_ids (mid-training)."""

    def __init__(self, data_dir, seq_len: int, batch_size: int, *, buffer: int = 1 << 16, **options):
        self.buffer = buffer  # documents considered at once by the best-fit packer
        super().__init__(data_dir, seq_len, batch_size, **options)

    def _count_rows(self) -> int:
        room = None if self.fim is None else self.fim.room.tolist()
        self.rows = pack([int(n) for n in self.shards.doc_len], self.seq_len, self.buffer, room)
        return len(self.rows)

    def _tokens(self, doc: int, start: int, n: int, epoch: int) -> np.ndarray:
        s = int(self.shards.doc_start[doc]) + start
        toks = self.shards.span(s, s + n)
        return toks if self.fim is None else self.fim.chunk(doc, start, toks, epoch)

    def row(self, i: int, epoch: int = 0) -> dict[str, np.ndarray]:
        tokens_of = functools.partial(self._tokens, epoch=epoch)
        return row_arrays(self.rows[i], tokens_of, self.seq_len, self.shards.eos_id)


def _context_fim(shards: TokenShards, fim: bool | None, tokenizer) -> ContextFIM | None:
    """The split's sampling-time FIM: on when its index.json has a FIM config, unless `fim=False`."""
    cfg = shards.meta.get("fim")
    if fim is False or (fim is None and not cfg):
        return None
    if not cfg:
        raise ValueError(f"{shards.folder}: fim=True, but these shards were built without FIM (fim_enabled=false)")
    if tokenizer is None:
        from glmstack.tokenizer import Tokenizer

        folder = shards.folder.parent / "tokenizer"
        if not (folder / "tokenizer.json").exists():
            raise ValueError(
                f"{shards.folder}: FIM at sampling time needs the tokenizer the shards were built with; "
                f"none at {folder} (pass tokenizer=, or fim=False)"
            )
        tokenizer = Tokenizer.load(folder)
    return ContextFIM(shards, FIMConfig(**cfg), tokenizer)


def build_loader(
    *,
    path,
    seq_len: int,
    batch_size: int,
    rank: int = 0,
    world_size: int = 1,
    seed: int = 0,
    split: str = "train",
    packing: str = "concat",
    **options,
):
    """The loader a training stage asks for by config (glmstack/train/stage.py, TrainConfig.data):
    packing "concat" -> PretrainLoader, "best_fit" -> PackedLoader; the validation split is read in order."""
    loaders = {"concat": PretrainLoader, "best_fit": PackedLoader}
    if packing not in loaders:
        raise ValueError(f"data.packing={packing!r}: expected one of {', '.join(loaders)}")
    return loaders[packing](
        path,
        seq_len=seq_len,
        batch_size=batch_size,
        rank=rank,
        world_size=world_size,
        seed=seed,
        shuffle=split == "train",
        **options,
    )
