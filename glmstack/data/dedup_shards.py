"""Exact dedup and MinHash near-dedup as sharded, disk-based stages: memory per task stays flat as the corpus grows.

`dedup.dedup_decisions` decides in one process with every signature in memory (~5.5 KB per document). Here the
same decisions come from three parallel stages on the pipeline's executors (local, processes, Ray, Slurm), each
a pure function of its work item that writes its files atomically, the marker last:

  1. keys (per block of consecutive units): exact hashes -> exact_{s}.npy records (hash lo, hash hi, rank);
     LSH band keys (a 64-bit hash of band index + band values) -> band_{s}.npy records (key, rank, location);
     shard s = key mod n_shards. `rank` is the document's place in the canonical order (eval first, then read
     order), `location` = unit << 24 | row, where its signature lies in sig_{unit}.npy.
  2. exact (per shard): sort the shard's records by (hash, rank); every copy after the first is dropped.
  3. minhash (per shard): drop the shard's band records of exact-dropped documents; sort by (key, rank); in each
     group of equal keys, a document is dropped when an EARLIER member shares a whole band with it and their
     signatures agree on >= threshold of all positions (signatures read from disk by location).
Then the driver takes the union of the shards' drop lists.

Why identical to the in-memory path: there a document is dropped ("minhash") iff some earlier document still
in the index (i.e. not exact-dropped; minhash-dropped ones stay) agrees on a whole band and is confirmed. That
predicate is per pair, so it decomposes over band shards and merges by union; a 64-bit key collision only adds
pairs that the whole-band check rejects. (Connected components with "the earliest wins" would NOT be
identical: with A~C, B~C and A!~B the in-memory path keeps B.) Stage outputs depend only on the input and
the shard count, never on workers, so a task killed mid-stage is redone on rerun with the same bytes.

Why not datatrove's MinHash stages: they word-split with spaCy (not installed), hash shingles modulo the
Mersenne prime 2^61-1 (different signatures from ours) and cluster with union-find (different decisions, see
above); we keep our shingling and run this design on datatrove's executors instead.

    python bench/dedup_scale.py --docs 1000000 2000000 --workers 2    # flat memory per task, linear time
"""

from __future__ import annotations

import functools
import json
import math
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from glmstack.atomic import write_atomic
from glmstack.data.dedup import MinHashConfig

_M1, _M2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9)
ROW_BITS = 24  # location = unit << 24 | row: up to 16M documents per unit


@dataclass(kw_only=True)
class ShardPlan:
    """Where the stages read and write, and how work is cut; `n_shards` is part of the output's identity."""

    inputs: Path  # per unit: sig_{u:05d}.npy (n, bands*rows) uint64, hash_{u:05d}.npy (n, 16) uint8, rank_{u:05d}.npy
    work: Path  # the stages' files
    blocks: list[list[int]]  # consecutive units per keys task
    n_shards: int
    cfg: MinHashConfig

    def unit_file(self, kind: str, u: int) -> Path:
        return self.inputs / f"{kind}_{u:05d}.npy"


def make_plan(
    inputs: Path, work: Path, docs_per_unit: list[int], cfg: MinHashConfig, block_docs: int, shard_records: int
) -> ShardPlan:
    """Blocks of ~block_docs documents; enough shards that one holds ~shard_records band records."""
    blocks: list[list[int]] = [[]]
    size = 0
    for u, n in enumerate(docs_per_unit):
        if blocks[-1] and size + n > block_docs:
            blocks.append([])
            size = 0
        blocks[-1].append(u)
        size += n
    n_shards = max(1, math.ceil(sum(docs_per_unit) * cfg.bands / shard_records))
    return ShardPlan(inputs=inputs, work=work, blocks=blocks, n_shards=n_shards, cfg=cfg)


def band_keys(sigs: np.ndarray, cfg: MinHashConfig) -> np.ndarray:
    """(n, bands) uint64: a mix of the band index and its `rows` values (equal bands -> equal keys)."""
    n = len(sigs)
    bands = sigs.reshape(n, cfg.bands, cfg.rows)
    with np.errstate(over="ignore"):
        h = np.broadcast_to((np.arange(cfg.bands, dtype=np.uint64) + np.uint64(1)) * _M1, (n, cfg.bands)).copy()
        for r in range(cfg.rows):
            h = (h ^ bands[:, :, r]) * _M2
            h ^= h >> np.uint64(31)
    return h


def _by_shard(records: np.ndarray, shard_of: np.ndarray, n_shards: int) -> list[np.ndarray]:
    order = np.argsort(shard_of, kind="stable")
    cuts = np.searchsorted(shard_of[order], np.arange(1, n_shards))
    return np.split(records[order], cuts)


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _write_stats(path: Path, start: float, docs_in: int, docs_out: int) -> None:
    stats = {"seconds": time.perf_counter() - start, "peak_mb": _peak_mb(), "in": docs_in, "out": docs_out}
    write_atomic(path, json.dumps(stats))


def keys_task(plan: ShardPlan, b: int) -> None:
    """Stage 1 for block b: its documents' exact and band records, one file per shard each."""
    start, out = time.perf_counter(), plan.work / f"keys_{b:05d}"
    out.mkdir(parents=True, exist_ok=True)
    exact, band = [], []
    for u in plan.blocks[b]:
        sigs = np.load(plan.unit_file("sig", u))
        hashes = np.load(plan.unit_file("hash", u)).reshape(-1, 16)
        rank = np.load(plan.unit_file("rank", u)).astype(np.uint64)
        halves = np.ascontiguousarray(hashes).view(np.uint64).reshape(-1, 2)
        exact.append(np.column_stack([halves, rank]))
        keys = band_keys(sigs, plan.cfg)  # (n, bands)
        loc = (np.uint64(u) << np.uint64(ROW_BITS)) | np.arange(len(sigs), dtype=np.uint64)
        cols = [keys.ravel(), np.repeat(rank, plan.cfg.bands), np.repeat(loc, plan.cfg.bands)]
        band.append(np.column_stack(cols))
    exact_all = np.concatenate(exact) if exact else np.zeros((0, 3), np.uint64)
    band_all = np.concatenate(band) if band else np.zeros((0, 3), np.uint64)
    s = np.uint64(plan.n_shards)
    for kind, recs in (("exact", exact_all), ("band", band_all)):
        for shard, part in enumerate(_by_shard(recs, recs[:, 0] % s, plan.n_shards)):
            write_atomic(out / f"{kind}_{shard:04d}.npy", functools.partial(np.save, arr=part))
    _write_stats(plan.work / f"keys_{b:05d}.json", start, len(exact_all), len(exact_all))


def _gather(plan: ShardPlan, kind: str, s: int) -> np.ndarray:
    """A shard's records from every block, into one preallocated array (no concatenate copy)."""
    paths = [plan.work / f"keys_{b:05d}" / f"{kind}_{s:04d}.npy" for b in range(len(plan.blocks))]
    parts = [np.load(p, mmap_mode="r") for p in paths]
    out = np.empty((sum(len(p) for p in parts), 3), np.uint64)
    at = 0
    for p in parts:
        out[at : at + len(p)] = p
        at += len(p)
    del parts
    return out


def exact_task(plan: ShardPlan, s: int) -> None:
    """Stage 2 for shard s: the ranks of every exact copy after the first (sorted)."""
    start = time.perf_counter()
    recs = _gather(plan, "exact", s)
    recs = recs[np.lexsort((recs[:, 2], recs[:, 1], recs[:, 0]))]
    same = np.all(recs[1:, :2] == recs[:-1, :2], axis=1)
    drops = np.sort(recs[1:, 2][same]).astype(np.int64)
    write_atomic(plan.work / f"exact_drop_{s:04d}.npy", functools.partial(np.save, arr=drops))
    _write_stats(plan.work / f"exact_{s:04d}.json", start, len(recs), len(recs) - len(drops))


def _read_sigs(plan: ShardPlan, locs: np.ndarray) -> np.ndarray:
    """(len(locs), width) signatures by location (sorted unique locs), one memory-mapped unit file at a time."""
    out = np.empty((len(locs), plan.cfg.bands * plan.cfg.rows), np.uint64)
    units = locs >> np.uint64(ROW_BITS)
    rows = (locs & np.uint64((1 << ROW_BITS) - 1)).astype(np.int64)
    cuts = np.flatnonzero(np.r_[True, units[1:] != units[:-1], True]) if len(locs) else np.zeros(1, np.int64)
    for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist()):
        sigs = np.load(plan.unit_file("sig", int(units[a])), mmap_mode="r")
        out[a:b] = sigs[rows[a:b]]
        del sigs
    return out


def _confirmed(sigs: np.ndarray, j: np.ndarray, i: np.ndarray, cfg: MinHashConfig) -> np.ndarray:
    """For pairs (j, i) of rows of `sigs`: a whole band equal and agreement >= threshold (the in-memory test)."""
    out = np.zeros(len(i), bool)
    for a in range(0, len(i), 65536):  # chunks bound the (pairs, width) temporaries
        eq = sigs[j[a : a + 65536]] == sigs[i[a : a + 65536]]
        band_hit = eq.reshape(len(eq), cfg.bands, cfg.rows).all(axis=2).any(axis=1)
        out[a : a + 65536] = band_hit & (eq.mean(axis=1) >= cfg.threshold)
    return out


SMALL_GROUP = 32  # groups up to this size test all their pairs at once; larger ones go member by member


def _group_pairs(starts: np.ndarray, g: int) -> tuple[np.ndarray, np.ndarray]:
    """Every (earlier, later) record index pair inside the groups of size g beginning at `starts`."""
    tj, ti = np.triu_indices(g, k=1)
    return (starts[:, None] + tj).ravel(), (starts[:, None] + ti).ravel()


def _large_group_drops(sigs: np.ndarray, rows: np.ndarray, cfg: MinHashConfig) -> list[int]:
    """Positions of a large group with a confirmed earlier member, earliest candidates first (as in-memory)."""
    drops = []
    for i in range(1, len(rows)):
        for a in range(0, i, 256):
            j = rows[a : min(i, a + 256)]
            if _confirmed(sigs, j, np.full(len(j), rows[i]), cfg).any():
                drops.append(i)
                break
    return drops


def minhash_task(plan: ShardPlan, s: int) -> None:
    """Stage 3 for shard s: ranks of documents with a confirmed earlier near-duplicate in one of its buckets."""
    start = time.perf_counter()
    recs = _gather(plan, "band", s)
    n_in = len(recs)
    recs = recs[~_exact_dropped(plan, recs[:, 1].astype(np.int64))]
    recs = recs[np.lexsort((recs[:, 1], recs[:, 0]))]
    keys = recs[:, 0]
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    sizes = np.diff(np.r_[starts, len(keys)])
    starts, sizes = starts[sizes > 1], sizes[sizes > 1]
    member = np.repeat(starts, sizes) + (np.arange(sizes.sum()) - np.repeat(np.cumsum(sizes) - sizes, sizes))
    recs = recs[member]  # only records in groups of two or more; group g now starts at offsets[g]
    offsets = np.cumsum(sizes) - sizes
    locs, row_of = np.unique(recs[:, 2], return_inverse=True)
    sigs = _read_sigs(plan, locs)
    dropped = []
    for g in np.unique(sizes).tolist():
        at = offsets[sizes == g]
        if g <= SMALL_GROUP:
            j, i = _group_pairs(at, g)
            dropped.append(recs[i[_confirmed(sigs, row_of[j], row_of[i], plan.cfg)], 1])
        else:
            for a in at.tolist():
                drops = _large_group_drops(sigs, row_of[a : a + g], plan.cfg)
                dropped.append(recs[a + np.array(drops, np.int64), 1])
    out = np.unique(np.concatenate(dropped)).astype(np.int64) if dropped else np.zeros(0, np.int64)
    write_atomic(plan.work / f"minhash_drop_{s:04d}.npy", functools.partial(np.save, arr=out))
    _write_stats(plan.work / f"minhash_{s:04d}.json", start, n_in, len(out))


def _exact_dropped(plan: ShardPlan, ranks: np.ndarray) -> np.ndarray:
    """Boolean mask: rank is exact-dropped (the driver's merged, sorted list, memory-mapped)."""
    drops = np.load(plan.work / "exact_drop_all.npy", mmap_mode="r")
    if not len(drops):
        return np.zeros(len(ranks), bool)
    at = np.minimum(np.searchsorted(drops, ranks), len(drops) - 1)
    return drops[at] == ranks


STAGES = (("keys", keys_task), ("exact", exact_task), ("minhash", minhash_task))
STATS = {"keys": "keys_{:05d}.json", "exact": "exact_{:04d}.json", "minhash": "minhash_{:04d}.json"}


def run_sharded_dedup(plan: ShardPlan, run: Callable) -> dict:
    """Run the three stages with `run(fn, items, done, desc=...)` (executor.run_units); returns
    {"exact": sorted ranks, "minhash": sorted ranks, "stages": per-stage summary}. A rerun skips finished tasks."""
    plan.work.mkdir(parents=True, exist_ok=True)
    clean_partial(plan.work)
    items = {"keys": range(len(plan.blocks)), "exact": range(plan.n_shards), "minhash": range(plan.n_shards)}
    stages = {}
    for name, fn in STAGES:
        start = time.perf_counter()
        marker = functools.partial(_marker, plan.work, STATS[name])
        run(functools.partial(fn, plan), list(items[name]), marker, desc=f"dedup/{name}")
        stages[name] = _stage_summary(plan.work, STATS[name], items[name], time.perf_counter() - start)
        if name == "exact":  # one sorted list for the minhash tasks (one lookup each, not one per shard)
            exact = _union(plan, "exact_drop")
            write_atomic(plan.work / "exact_drop_all.npy", functools.partial(np.save, arr=exact))
    minhash = _union(plan, "minhash_drop")
    n = stages["keys"]["records_in"]
    stages["keys"].update(docs_in=n, docs_out=n)
    stages["exact"].update(docs_in=n, docs_out=n - len(exact))
    stages["minhash"].update(docs_in=n - len(exact), docs_out=n - len(exact) - len(minhash))
    return {"exact": exact, "minhash": minhash, "stages": stages}


def _marker(work: Path, pattern: str, i: int) -> Path:
    return work / pattern.format(i)


def _stage_summary(work: Path, pattern: str, items, wall: float) -> dict:
    stats = [json.loads((work / pattern.format(i)).read_text()) for i in items]
    return {
        "tasks": len(stats),
        "records_in": sum(s["in"] for s in stats),
        "records_out": sum(s["out"] for s in stats),
        "seconds": round(wall, 3),
        "task_seconds_max": round(max((s["seconds"] for s in stats), default=0.0), 3),
        "peak_mb_per_task": round(max((s["peak_mb"] for s in stats), default=0.0), 1),
    }


def _union(plan: ShardPlan, kind: str) -> np.ndarray:
    parts = [np.load(plan.work / f"{kind}_{s:04d}.npy") for s in range(plan.n_shards)]
    return np.unique(np.concatenate(parts)) if parts else np.zeros(0, np.int64)


def clean_partial(work: Path) -> None:
    """Temporary files of killed tasks (write_atomic's dot-files) are left behind; remove them."""
    for p in work.rglob(".*.tmp-*"):
        p.unlink(missing_ok=True)


def decisions_from(result: dict, n: int) -> list[str | None]:
    """The in-memory path's list (canonical order): None = keep, else "exact" / "minhash"."""
    out: list[str | None] = [None] * n
    for r in result["minhash"].tolist():
        out[r] = "minhash"
    for r in result["exact"].tolist():
        out[r] = "exact"
    return out


def write_units(inputs: Path, sigs: np.ndarray, hashes: np.ndarray, unit_docs: int, first_unit: int = 0) -> list[int]:
    """Write documents already in canonical order as units of `unit_docs` (bench and tests); returns their sizes."""
    inputs.mkdir(parents=True, exist_ok=True)
    counts = []
    for k, a in enumerate(range(0, len(sigs), unit_docs)):
        u, n = first_unit + k, min(unit_docs, len(sigs) - a)
        np.save(inputs / f"sig_{u:05d}.npy", sigs[a : a + n])
        np.save(inputs / f"hash_{u:05d}.npy", hashes[a : a + n])
        np.save(inputs / f"rank_{u:05d}.npy", np.arange(a, a + n, dtype=np.int64))
        counts.append(n)
    return counts
