"""Quality buckets -> epoch multipliers -> a deterministic number of copies per document.

GLM-4.5 §2.2: web documents are bucketed by quality score; the top bucket is seen more than 3.2 epochs and
the bottom bucket is dropped. Following Nemotron-CC, scores are ranked per source into 20 percentile buckets
(so one source's score scale never moves another's), buckets are grouped into levels, and each level carries
an epoch multiplier e. A document is emitted floor(e) times plus once more with probability e - floor(e),
decided by a seeded hash of its id, so reruns and any number of workers give identical copies.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field

import numpy as np


@dataclass(kw_only=True)
class MixtureConfig:
    n_buckets: int = 20  # percentile buckets per source (Nemotron-CC uses 20)
    epochs_by_level: list[float] = field(default_factory=lambda: [0.0, 0.5, 1.0, 2.0, 3.2])
    # ^ epoch multiplier per level, lowest quality first; buckets split evenly into len(...) levels.
    #   GLM-4.5: top > 3.2 epochs, bottom dropped.
    source_epochs: dict[str, list[float]] = field(default_factory=dict)  # per-source override of epochs_by_level
    unscored_epochs: float = 1.0  # multiplier for sources without scores (e.g. math from generators)
    seed: int = 0  # seeds the fractional-copy draws and the shuffle


def unit_hash(seed: int, *parts) -> float:
    """Uniform in [0, 1) from a keyed hash: independent of process, worker count and PYTHONHASHSEED."""
    key = ":".join(map(str, (seed, *parts))).encode("utf-8", errors="replace")
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") / 2.0**64


def percentile_buckets(scores: np.ndarray, n_buckets: int) -> np.ndarray:
    """bucket = floor(n_buckets * rank / N); ties broken by position so buckets are equal-sized within one."""
    n = len(scores)
    ranks = np.empty(n, dtype=np.int64)
    ranks[np.argsort(scores, kind="stable")] = np.arange(n)
    return np.minimum(n_buckets - 1, (n_buckets * ranks) // max(1, n))


def level_of(bucket: int, n_buckets: int, n_levels: int) -> int:
    return bucket * n_levels // n_buckets


def epochs_for(source: str, level: int | None, cfg: MixtureConfig) -> float:
    if level is None:
        return cfg.unscored_epochs
    return cfg.source_epochs.get(source, cfg.epochs_by_level)[level]


def n_copies(doc_id: str, epochs: float, seed: int) -> int:
    whole = math.floor(epochs)
    return whole + (1 if unit_hash(seed, "copy", doc_id) < epochs - whole else 0)


def assign_levels(sources: list[str], scores: list[float | None], cfg: MixtureConfig) -> list[int | None]:
    """Per-source percentile level for each scored document (None where unscored)."""
    levels: list[int | None] = [None] * len(scores)
    n_levels = len(cfg.epochs_by_level)
    by_source: dict[str, list[int]] = {}
    for i, (s, sc) in enumerate(zip(sources, scores)):
        if sc is not None:
            by_source.setdefault(s, []).append(i)
    for idx in by_source.values():
        buckets = percentile_buckets(np.array([scores[i] for i in idx]), cfg.n_buckets)
        for i, b in zip(idx, buckets):
            levels[i] = level_of(int(b), cfg.n_buckets, n_levels)
    return levels
