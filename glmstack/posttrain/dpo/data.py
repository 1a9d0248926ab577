"""Preference pairs for DPO: `glmstack rm`'s readers and synthetic sets (glmstack/posttrain/rm/data.py), encoded with
the chat encoder's assistant-only masks, batched by rm's PreferenceBatches with the masks (and, when the reference's
log-probs are cached, those) added.

Why masks: DPO's log-probs are sums over the completion only (the prompt is the same on both sides and not the
policy's to choose); glmstack.chat.encode marks exactly the tokens the model generates, as SFT trains them, the
closing `<|endoftext|>` included.

A micro-batch (B = micro_batch_size pairs, chosen rows then rejected rows, right padded to seq_len):
  input_ids (2B, T), segment_ids (2B, T) 1 on tokens, last (2B,)   as rm's batches
  loss_mask (2B, T)   1 on completion tokens
  ref_logps (2B,)     the reference's completion log-probs (only when cached, reference.py)
  loss_count ()       the pairs B: the loop weighs micro-batches by it, so the step's loss is the mean over its
                      pairs, as TRL's

Packed (`dpo.packing`): the same 2B sequences placed first-fit-decreasing into as few rows of seq_len as hold them,
so short pairs do not pay for padding: `input_ids`, `loss_mask (R, T)`, `segment_ids (R, T)` numbering the sequences
of a row 1..k (0 = padding: attention never crosses a sequence), `position_ids (R, T)` restarting at 0 for each, and
`seq_of (R, T)` which of the 2B sequences a token belongs to (−1 = padding; loss.batch_logps sums by it). A
sequence's first token is never scored (it follows another sequence), as in the padded layout.

    pairs = encoded_pairs(["synthetic:checkable"], folder, 200, seed, "train", tokenizer, "glm-4.5")
    batches = DPOBatches(pairs, batch_size=8, seq_len=64, pad_id=pad, seed=0)
"""

from __future__ import annotations

from pathlib import Path

import torch

from glmstack.posttrain.rm.data import PreferenceBatches, data_files, pad_rows, read_pairs

Encoded = tuple[list[int], list[int], list[int], list[int]]  # chosen ids, rejected ids, chosen mask, rejected mask


def encode_pair(tokenizer, pair, style: str) -> Encoded:
    """(prompt, chosen reply, rejected reply) messages -> ids and assistant-only masks of both conversations."""
    from glmstack.chat import encode

    prompt, chosen, rejected = pair
    ids_c, mask_c = encode(tokenizer, prompt + chosen, None, style=style, enable_thinking=False)
    ids_r, mask_r = encode(tokenizer, prompt + rejected, None, style=style, enable_thinking=False)
    return ids_c, ids_r, mask_c, mask_r


def encoded_pairs(entries: list[str], folder: Path, n: int, seed: int, split: str, tokenizer, style: str,
                  option: str = "dpo.data") -> list[Encoded]:  # fmt: skip
    """Every pair of the entries (files, or synthetic sets written to `folder` first), encoded."""
    paths = data_files(entries, folder, n, seed, split)
    return [encode_pair(tokenizer, p, style) for path in paths for p in read_pairs(path, option)]


def pack_rows(rows: list[list[int]], masks: list[list[int]], length: int, pad_id: int) -> dict:
    """Sequences (each ≤ length) first-fit-decreasing into rows of `length` -> the packed micro-batch (docstring)."""
    bins: list[list[int]] = []  # sequence indices per row
    room: list[int] = []
    for i in sorted(range(len(rows)), key=lambda i: (-len(rows[i]), i)):
        r = next((b for b, free in enumerate(room) if free >= len(rows[i])), None)
        if r is None:
            bins.append([]), room.append(length)
            r = len(bins) - 1
        bins[r].append(i)
        room[r] -= len(rows[i])
    shape = (len(bins), length)
    out = {"input_ids": torch.full(shape, pad_id, dtype=torch.long), "loss_mask": torch.zeros(shape, dtype=torch.long),
           "segment_ids": torch.zeros(shape, dtype=torch.long), "position_ids": torch.zeros(shape, dtype=torch.long),
           "seq_of": torch.full(shape, -1, dtype=torch.long)}  # fmt: skip
    for r, members in enumerate(bins):
        at = 0
        for k, i in enumerate(sorted(members)):
            n, span = len(rows[i]), slice(at, at + len(rows[i]))
            out["input_ids"][r, span], out["loss_mask"][r, span] = torch.tensor(rows[i]), torch.tensor(masks[i])
            out["loss_mask"][r, at] = 0  # a sequence's first token follows another sequence: never scored
            out["segment_ids"][r, span], out["position_ids"][r, span], out["seq_of"][r, span] = k + 1, torch.arange(n), i
            at += n
    return out


class DPOBatches(PreferenceBatches):
    """rm's resumable, rank-aware pair batches + `loss_mask` (+ `ref_logps` once `ref` (N, 2) is set); packed rows
    when `packing` is set."""

    ref: torch.Tensor | None = None  # (pairs, 2) reference log-probs (chosen, rejected) in self.pairs' order
    packing: bool = False

    def __next__(self) -> dict:
        return self.batch_of(self.next_indices())

    def batch_of(self, take: list[int]) -> dict:
        rows = [self.pairs[i][0] for i in take] + [self.pairs[i][1] for i in take]
        masks = [self.pairs[i][2] for i in take] + [self.pairs[i][3] for i in take]
        if self.packing:
            batch = pack_rows(rows, masks, self.seq_len, self.pad_id)
        else:
            batch = pad_rows(rows, self.seq_len, self.pad_id)
            batch["loss_mask"] = pad_rows(masks, self.seq_len, 0)["input_ids"]  # (2B, T)
        batch["loss_count"] = torch.tensor(len(take))  # the loop weighs micro-batches by their pairs
        if self.ref is not None:
            batch["ref_logps"] = torch.cat([self.ref[take, 0], self.ref[take, 1]])  # (2B,)
        return batch

    def once(self) -> list[dict]:
        """Every pair once, in order, as micro-batches (the last may be short): held-out scoring, caching."""
        idx = list(range(len(self.pairs)))
        return [self.batch_of(idx[i : i + self.batch_size]) for i in range(0, len(idx), self.batch_size)]
