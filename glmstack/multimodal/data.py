"""Multimodal conversations -> training batches for the one loop: token ids, SFT labels and the batch's pixels.

What: `read_multimodal(paths)` reads SFT records (glmstack.posttrain.sft_data: OpenAI messages / ShareGPT, JSONL /
Parquet / folders) whose user turns may hold image and video parts; a relative image path is resolved against the
folder of the file that names it. `VisionSFT(examples, batch_size=, seed=)` is the loader of the data-batches
contract (docs/CONTRACTS.md):
    {"input_ids", "labels": (B, T) long, "pixel_values"?, "image_grid_thw"?, "pixel_values_videos"?, "video_grid_thw"?}
one conversation per row, right-padded to the longest row of the batch (labels -100 there), the images of the batch
concatenated in row order (the order the model consumes them). `labels[t]` is token t+1 where chat.encode trains it.

Why not packed like text SFT (posttrain/packed.py): a row of the tiny recipe is ~40 tokens, so padding costs
little, and one conversation per row keeps each image's 3D positions starting at its own prompt. Each epoch is a
permutation seeded by (seed, epoch): batch i is a pure function of (seed, i), so the position is one integer and
resume is exact (GlobalBatchPosition, as PackedSFT).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from glmstack.config import ConfigError
from glmstack.data.position import GlobalBatchPosition
from glmstack.multimodal.encode import Encoded, encode_multimodal, image_source, media_kind
from glmstack.multimodal.processor import Media


def resolve_images(messages: list[dict], folder: Path) -> list[dict]:
    """Messages whose relative image paths (and video frame paths) point into `folder`."""

    def fix(src):
        if (
            isinstance(src, str)
            and not src.startswith(("data:", "http://", "https://"))
            and not Path(src).is_absolute()
        ):
            return str(folder / src)
        return src

    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list) and any(media_kind(p) for p in content):
            parts = []
            for p in content:
                if media_kind(p) == "image":
                    p = {"type": "image", "image": fix(image_source(p))}
                elif media_kind(p) == "video":
                    p = {"type": "video", "video": [fix(f) for f in p.get("video") or []]}
                parts.append(p)
            m = {**m, "content": parts}
        out.append(m)
    return out


def read_multimodal(paths, *, log=print) -> list[dict]:
    """Valid records of every file (skipped ones logged as `file:line: reason`), image paths resolved."""
    from glmstack.posttrain.sft_data import files_of, read_conversations

    records = []
    for path in files_of(paths):
        found, _ = read_conversations([path], log=log)
        records += [{**r, "messages": resolve_images(r["messages"], path.parent)} for r in found]
    return records


def encode_records(tokenizer, processor, records: list[dict], style: str) -> list[Encoded]:
    """Each record's ids, mask and pixels; a bad image stops with one line naming the record."""
    from glmstack.multimodal.images import ImageError

    out = []
    for i, r in enumerate(records):
        opts = {k: r[k] for k in ("enable_thinking", "clear_thinking") if k in r}
        try:
            out.append(encode_multimodal(tokenizer, processor, r["messages"], r.get("tools"), style=style, **opts))
        except ImageError as e:
            raise ConfigError(f"record {i}: {e}") from None
    return out


def collate(examples: list[Encoded], pad_id: int = 0) -> dict[str, torch.Tensor]:
    """Rows right-padded to the longest; labels = next token where trained, else -100; pixels concatenated."""
    T = max(len(e.ids) for e in examples)
    ids = np.full((len(examples), T), pad_id, np.int64)
    labels = np.full((len(examples), T), -100, np.int64)
    for b, e in enumerate(examples):
        n = len(e.ids)
        ids[b, :n] = e.ids
        target = np.asarray(e.ids[1:], np.int64)
        labels[b, : n - 1] = np.where(np.asarray(e.loss_mask[1:]) == 1, target, -100)
    batch = {"input_ids": torch.from_numpy(ids), "labels": torch.from_numpy(labels)}
    return batch | Media.concat([e.media for e in examples]).model_inputs()


class VisionSFT(GlobalBatchPosition):
    """Infinite, resumable batches of encoded multimodal conversations (see the module docstring)."""

    def __init__(self, examples: list[Encoded], *, batch_size: int, seed: int = 0, rank: int = 0, world_size: int = 1,
                 shuffle: bool = True, pad_id: int = 0, max_len: int | None = None):  # fmt: skip
        kept = [e for e in examples if max_len is None or len(e.ids) <= max_len]
        self.dropped_long = len(examples) - len(kept)
        if not kept:
            raise ValueError(f"no conversation fits in seq_len={max_len} ({len(examples)} given)")
        self.examples, self.batch_size, self.seed, self.shuffle, self.pad_id = kept, batch_size, seed, shuffle, pad_id
        self.rank, self.world_size, self.position = rank, world_size, 0
        self._order: dict[int, np.ndarray] = {}

    def order(self, epoch: int) -> np.ndarray:
        if epoch not in self._order:
            n = len(self.examples)
            self._order = {epoch: np.random.default_rng([self.seed, epoch]).permutation(n) if self.shuffle
                           else np.arange(n)}  # fmt: skip
        return self._order[epoch]

    def example(self, k: int) -> Encoded:
        """The k-th conversation of the stream over all epochs."""
        epoch, i = divmod(k, len(self.examples))
        return self.examples[int(self.order(epoch)[i])]

    def batch(self, index: int) -> dict[str, torch.Tensor]:
        first = (index * self.world_size + self.rank) * self.batch_size
        return collate([self.example(first + b) for b in range(self.batch_size)], self.pad_id)


class VQAStream(GlobalBatchPosition):
    """An endless synthetic visual QA stream (multimodal.vqa): batch i holds the items generated from seed
    (seed, i), encoded on the fly, so no image is seen twice, nothing is held in memory, and the position is one
    integer (exact resume). Only training-split scenes are drawn (vqa.generate's split filter)."""

    def __init__(self, tokenizer, processor, *, batch_size: int, seed: int = 0, style: str = "glm-4.5",
                 rank: int = 0, world_size: int = 1, level: int | None = None):  # fmt: skip
        self.tokenizer, self.processor, self.style, self.level = tokenizer, processor, style, level
        self.batch_size, self.seed, self.rank, self.world_size, self.position = batch_size, seed, rank, world_size, 0

    def batch(self, index: int) -> dict[str, torch.Tensor]:
        from glmstack.multimodal.vqa import generate, messages

        items = generate(self.batch_size, seed=self.seed * 1_000_003 + index * self.world_size + self.rank,
                         split="train", level=self.level)  # fmt: skip
        return collate([encode_multimodal(self.tokenizer, self.processor, messages(it), style=self.style,
                                          enable_thinking=False) for it in items])  # fmt: skip
