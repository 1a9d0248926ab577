"""Exact and near-duplicate removal: a normalised-text hash, then MinHash signatures with LSH banding.

Near-duplicates (Broder 1997; FineWeb's datatrove recipe): a document is the set of its word n-gram shingles
(5-grams of lowercased words); `num_perm = bands * rows` hash functions each keep their minimum over the set,
and two documents whose signatures agree on all `rows` values of any band become candidates. A candidate is
confirmed only when the signatures agree on at least `threshold` of all positions (an unbiased Jaccard estimate),
which is what keeps false positives low while a wide banding (20 x 5) keeps recall high: P(candidate | J=0.8)
= 1 - (1 - 0.8^5)^20 = 0.9996, against 0.924 for datatrove's 14 x 8.

Why our own and not datatrove's MinHash: datatrove's four-stage MinHash needs spacy for word splitting (not
installed) and round-trips signatures through files; ours is a numpy matrix product per document (multiply-shift
hashing), and bench/minhash.py measures it against datasketch in the same run (docs/data.md has the figures).

Documents are processed in a fixed order and a duplicate always loses to the earliest document it matches, so
the survivors are the same on every run and with any number of workers (signatures are computed in workers,
decisions in one process).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

import numpy as np

WORD_RE = re.compile(r"\w+", re.UNICODE)
_MASK64 = (1 << 64) - 1


@dataclass(kw_only=True)
class MinHashConfig:
    ngram: int = 5  # words per shingle (FineWeb uses 5)
    bands: int = 20  # LSH bands; more bands = higher recall at lower similarity
    rows: int = 5  # signature values per band; num_perm = bands * rows
    threshold: float = 0.7  # confirm a candidate pair when its estimated Jaccard is at least this
    seed: int = 1  # seeds the hash functions; fixed so signatures are comparable across runs


def normalize(text: str) -> str:
    """Lowercase, collapse whitespace: exact dedup ignores formatting-only differences."""
    return " ".join(text.lower().split())


def exact_hash(text: str) -> bytes:
    return hashlib.blake2b(normalize(text).encode("utf-8", errors="replace"), digest_size=16).digest()


def _word_hash(word: str, cache: dict) -> int:
    h = cache.get(word)
    if h is None:
        h = int.from_bytes(hashlib.blake2b(word.encode("utf-8", errors="replace"), digest_size=8).digest(), "little")
        cache[word] = h
    return h


class MinHasher:
    """Computes MinHash signatures; `params` are odd 64-bit multipliers and offsets (multiply-shift family)."""

    def __init__(self, cfg: MinHashConfig):
        self.cfg = cfg
        self.num_perm = cfg.bands * cfg.rows
        rng = np.random.default_rng(cfg.seed)
        self.a = rng.integers(1, 2**63, size=self.num_perm, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
        self.b = rng.integers(0, 2**63, size=self.num_perm, dtype=np.uint64)
        self._cache: dict[str, int] = {}

    def shingles(self, text: str) -> np.ndarray:
        """64-bit hashes of the word n-grams (a polynomial combination of per-word hashes, wrapping in uint64)."""
        if len(self._cache) > 2_000_000:
            self._cache.clear()  # bounded memory on long streams
        ws = WORD_RE.findall(text.lower())
        wh = np.fromiter((_word_hash(w, self._cache) for w in ws), dtype=np.uint64, count=len(ws))
        n = self.cfg.ngram
        if len(wh) < n:  # a short document is one shingle
            return np.array([np.bitwise_xor.reduce(wh) if len(wh) else 0], dtype=np.uint64)
        with np.errstate(over="ignore"):
            out = wh[: len(wh) - n + 1].copy()
            for k in range(1, n):
                out = out * np.uint64(0x9E3779B97F4A7C15) + wh[k : len(wh) - n + 1 + k]
        return np.unique(out)

    def signature(self, text: str) -> np.ndarray:
        sh = self.shingles(text)
        sig = np.full(self.num_perm, np.iinfo(np.uint64).max, dtype=np.uint64)
        with np.errstate(over="ignore"):
            for i in range(0, len(sh), 2048):  # blocks bound the (shingles x perms) matrix
                block = sh[i : i + 2048, None] * self.a[None, :] + self.b[None, :]
                np.minimum(sig, block.min(axis=0), out=sig)
        return sig


class LSHIndex:
    """Banded LSH over signatures; `add` returns the index of the earliest confirmed near-duplicate, or -1."""

    def __init__(self, cfg: MinHashConfig):
        self.cfg = cfg
        self.tables: list[dict[bytes, list[int]]] = [{} for _ in range(cfg.bands)]
        self.sigs: list[np.ndarray] = []

    def add(self, sig: np.ndarray) -> int:
        r = self.cfg.rows
        keys = [sig[b * r : (b + 1) * r].tobytes() for b in range(self.cfg.bands)]
        candidates = sorted({j for b, k in enumerate(keys) for j in self.tables[b].get(k, ())})
        match = -1
        for j in candidates:  # earliest first: the survivor of a cluster is its first document
            if np.mean(self.sigs[j] == sig) >= self.cfg.threshold:
                match = j
                break
        idx = len(self.sigs)
        self.sigs.append(sig)
        for b, k in enumerate(keys):
            self.tables[b].setdefault(k, []).append(idx)
        return match


def dedup_decisions(exact: list[bytes], sigs: list[np.ndarray | None], cfg: MinHashConfig) -> list[str | None]:
    """For documents in canonical order: None = keep, else "exact" / "minhash" (why it was dropped).

    `sigs[i]` may be None to skip near-dedup for that document (exact dedup still applies).
    """
    seen: set[bytes] = set()
    index = LSHIndex(cfg)
    out: list[str | None] = []
    for h, sig in zip(exact, sigs):
        if h in seen:
            out.append("exact")
            continue
        seen.add(h)
        out.append("minhash" if sig is not None and index.add(sig) >= 0 else None)
    return out


def jaccard(a: str, b: str, ngram: int = 5) -> float:
    """Exact shingle Jaccard (tests and benchmarks use it as ground truth)."""

    def sh(t):
        ws = WORD_RE.findall(t.lower())
        return {tuple(ws[i : i + ngram]) for i in range(max(1, len(ws) - ngram + 1))}

    sa, sb = sh(a), sh(b)
    return len(sa & sb) / max(1, len(sa | sb))
