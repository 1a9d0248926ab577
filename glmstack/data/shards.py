"""Token shards: memory-mapped uint32 token files with a document index.

Layout of one split folder (e.g. runs/data/train/):
    shard_00000.bin        uint32 token ids, documents back to back (each ends with <|endoftext|>)
    shard_00000.idx.npy    int64 (n_docs + 1,) document start offsets into the .bin, last = its length
    shard_00000.docs.npy   per document (key, copy, kind): what the loader's sampling-time FIM is seeded by and
                           applied to (`DOC_DTYPE`; written by the data build, absent for plain token files)
    index.json             {"dtype", "eos_id", "vocab_size", "shards": [{"name", "tokens", "docs"}], "fim", ...}
uint32 because GLM's 151,552-token vocabulary does not fit uint16. Every file is written to a temporary name
and renamed, and index.json is written last, so a crash never leaves a folder that looks complete.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from glmstack.atomic import write_atomic

DTYPE = np.uint32
# key: 64-bit hash of the document id; copy: which up-sampled copy (0, 1, ...); kind: KINDS index
DOC_DTYPE = np.dtype([("key", "<u8"), ("copy", "<u4"), ("kind", "u1")])
KINDS = ("text", "code", "repo", "math")


class ShardWriter:
    """Append documents (lists/arrays of ids); a shard is closed once it reaches `shard_tokens` tokens."""

    def __init__(self, folder: str | os.PathLike, shard_tokens: int, eos_id: int, vocab_size: int):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.shard_tokens = shard_tokens
        self.meta = {"dtype": "uint32", "eos_id": eos_id, "vocab_size": vocab_size, "shards": []}
        self._buf: list[np.ndarray] = []
        self._docs: list[tuple[int, int, int]] = []
        self._n = 0

    def add(self, ids, doc: tuple[int, int, str] | None = None) -> None:
        """Append one document; `doc` = (key, copy, kind) for every document of a split or for none."""
        self._buf.append(np.asarray(ids, dtype=DTYPE))
        if doc is not None:
            self._docs.append((doc[0], doc[1], KINDS.index(doc[2]) if doc[2] in KINDS else 0))  # other kinds: prose
        self._n += len(self._buf[-1])
        if self._n >= self.shard_tokens:
            self._flush()

    def _flush(self) -> None:
        if not self._buf:
            return
        name = f"shard_{len(self.meta['shards']):05d}"
        offsets = np.zeros(len(self._buf) + 1, dtype=np.int64)
        np.cumsum([len(b) for b in self._buf], out=offsets[1:])
        write_atomic(self.folder / f"{name}.bin", np.concatenate(self._buf).tobytes())
        write_atomic(self.folder / f"{name}.idx.npy", lambda tmp: np.save(tmp, offsets))
        if self._docs:
            docs = np.array(self._docs, dtype=DOC_DTYPE)
            write_atomic(self.folder / f"{name}.docs.npy", lambda tmp: np.save(tmp, docs))
        self.meta["shards"].append({"name": name, "tokens": int(offsets[-1]), "docs": len(self._buf)})
        self._buf, self._docs, self._n = [], [], 0

    def close(self, **extra) -> dict:
        self._flush()
        self.meta.update(extra)
        write_atomic(self.folder / "index.json", json.dumps(self.meta, indent=1) + "\n")
        return self.meta


class TokenShards:
    """Read side: the split as one token stream and as a list of documents, both memory-mapped."""

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        index = self.folder / "index.json"
        if not index.exists():
            raise FileNotFoundError(f"{index} not found: build the data first (glmstack data ...)")
        self.meta = json.loads(index.read_text())
        self.eos_id = int(self.meta["eos_id"])
        self.tokens = [
            np.memmap(self.folder / f"{s['name']}.bin", dtype=DTYPE, mode="r") if s["tokens"] else np.zeros(0, DTYPE)
            for s in self.meta["shards"]
        ]
        self.offsets = [np.load(self.folder / f"{s['name']}.idx.npy") for s in self.meta["shards"]]
        self.shard_start = np.zeros(len(self.tokens) + 1, dtype=np.int64)  # global token offset of each shard
        np.cumsum([len(t) for t in self.tokens], out=self.shard_start[1:])
        self.doc_start = np.concatenate(
            [o[:-1] + s for o, s in zip(self.offsets, self.shard_start)] or [np.zeros(0, np.int64)]
        )
        self.doc_len = np.concatenate([np.diff(o) for o in self.offsets] or [np.zeros(0, np.int64)])
        docs = [self.folder / f"{s['name']}.docs.npy" for s in self.meta["shards"]]
        # (key, copy, kind) per document, or None for shards written without them
        self.docs = np.concatenate([np.load(p) for p in docs]) if docs and all(p.exists() for p in docs) else None

    @property
    def n_tokens(self) -> int:
        return int(self.shard_start[-1])

    @property
    def n_docs(self) -> int:
        return len(self.doc_len)

    def span(self, start: int, end: int) -> np.ndarray:
        """Tokens [start, end) of the whole split (may cross shard boundaries)."""
        parts, s = [], int(np.searchsorted(self.shard_start, start, side="right") - 1)
        while start < end:
            base = int(self.shard_start[s])
            take = min(end, int(self.shard_start[s + 1])) - start
            parts.append(self.tokens[s][start - base : start - base + take])
            start += take
            s += 1
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)

    def doc(self, i: int) -> np.ndarray:
        return self.span(int(self.doc_start[i]), int(self.doc_start[i] + self.doc_len[i]))
