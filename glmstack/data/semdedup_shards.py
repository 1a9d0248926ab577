"""SemDeDup as sharded stages: embeddings per unit, k-means fitted on a sample, each cluster deduplicated per task.

semdedup.semdedup_mask holds every embedding in one process. Here (same executors as dedup_shards.py):
  1. embed (per unit, the pipeline's stages.embed_unit): emb_{u} (rows = the unit's prose survivors) + sem_idx_{u}
     (their index in canonical order);
  2. fit (driver): k-means with K = round(sqrt(N)) (capped at max_clusters), n_init=1, on the first
     `sample_docs` embeddings in canonical order; with N <= sample_docs that is every embedding, in the same
     order, so the clusters are exactly the in-memory path's;
  3. assign (per unit): predict each row's cluster; rows go to cluster shard (cluster mod n_shards) files;
  4. dedup (per shard): every cluster of the shard, members in canonical order, through semdedup._cluster_drops.
Memory per task is one unit's embeddings (assign) or one shard's clusters (dedup); the driver holds the sample.
"""

from __future__ import annotations

import functools
import json
import math
import pickle
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from glmstack.atomic import write_atomic
from glmstack.data.dedup_shards import _peak_mb, _write_stats
from glmstack.data.semdedup import DEFAULT_EPS, SemDedupConfig, _cluster_drops


def save_rows(path: Path, X) -> None:
    """Embeddings of one file: sparse CSR (hashed embedder) as .npz, dense as .npy (path without suffix)."""
    import scipy.sparse as sp

    if sp.issparse(X):
        write_atomic(path.with_suffix(".npz"), lambda tmp: sp.save_npz(tmp, sp.csr_matrix(X), compressed=False))
    else:
        write_atomic(path.with_suffix(".npy"), lambda tmp: np.save(tmp, np.asarray(X, np.float32)))


def load_rows(path: Path):
    import scipy.sparse as sp

    return (
        sp.load_npz(path.with_suffix(".npz"))
        if path.with_suffix(".npz").exists()
        else np.load(path.with_suffix(".npy"))
    )


def _stack(parts):
    import scipy.sparse as sp

    return sp.vstack(parts, format="csr") if sp.issparse(parts[0]) else np.concatenate(parts)


@dataclass(kw_only=True)
class SemPlan:
    work: Path  # emb_{u}, sem_idx_{u}.npy per unit (from the embed stage); this module's files under work/semdedup
    units: list[int]
    cfg: SemDedupConfig
    embedder: str  # "hashed" or "minilm": picks the default eps
    n_shards: int = 1

    @property
    def out(self) -> Path:
        return self.work / "semdedup"


def fit_kmeans(plan: SemPlan, sample_docs: int, n_docs: int) -> None:
    """Driver: k-means on the first sample_docs embeddings (canonical order); saved for the assign tasks."""
    from sklearn.cluster import KMeans

    path = plan.out / "kmeans.pkl"
    if path.exists():
        return
    parts, have = [], 0
    for u in plan.units:
        if have >= sample_docs:
            break
        X = load_rows(plan.work / f"emb_{u:05d}")
        parts.append(X[: sample_docs - have])
        have += parts[-1].shape[0]
    k = int(min(plan.cfg.max_clusters, max(1, round(np.sqrt(n_docs)))))
    km = KMeans(n_clusters=k, n_init=1, random_state=plan.cfg.seed).fit(_stack(parts))
    plan.out.mkdir(parents=True, exist_ok=True)
    write_atomic(path, pickle.dumps(km))


def assign_task(plan: SemPlan, u: int) -> None:
    """Per unit: cluster of each embedding; rows + canonical index + cluster into one file per cluster shard."""
    start = time.perf_counter()
    km = pickle.loads((plan.out / "kmeans.pkl").read_bytes())
    X, idx = load_rows(plan.work / f"emb_{u:05d}"), np.load(plan.work / f"sem_idx_{u:05d}.npy")
    labels = km.predict(X) if len(idx) else np.zeros(0, np.int64)
    folder = plan.out / f"assign_{u:05d}"
    folder.mkdir(parents=True, exist_ok=True)
    for s in range(plan.n_shards):
        sel = np.flatnonzero(labels % plan.n_shards == s)
        save_rows(folder / f"rows_{s:04d}", X[sel])
        write_atomic(folder / f"idx_{s:04d}.npy", functools.partial(np.save, arr=np.stack([idx[sel], labels[sel]])))
    _write_stats(plan.out / f"assign_{u:05d}.json", start, len(idx), len(idx))


def dedup_task(plan: SemPlan, s: int) -> None:
    """Per cluster shard: the canonical indices SemDeDup drops, cluster by cluster (members in canonical order)."""
    start = time.perf_counter()
    rows, meta = [], []
    for u in plan.units:
        folder = plan.out / f"assign_{u:05d}"
        m = np.load(folder / f"idx_{s:04d}.npy")
        if m.shape[1]:
            rows.append(load_rows(folder / f"rows_{s:04d}"))
            meta.append(m)
    drops = []
    if meta:
        X, (idx, labels) = _stack(rows), np.concatenate(meta, axis=1)
        eps = plan.cfg.eps if plan.cfg.eps is not None else DEFAULT_EPS[plan.embedder]
        order = np.lexsort((idx, labels))  # by cluster, members in canonical order
        cuts = np.flatnonzero(np.r_[True, labels[order][1:] != labels[order][:-1], True])
        for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist()):
            members = order[a:b]
            if len(members) > 1:
                drops.append(idx[members[_cluster_drops(X[members], eps)]])
    out = np.sort(np.concatenate(drops)) if drops else np.zeros(0, np.int64)
    write_atomic(plan.out / f"drop_{s:04d}.npy", functools.partial(np.save, arr=out.astype(np.int64)))
    _write_stats(plan.out / f"dedup_{s:04d}.json", start, sum(m.shape[1] for m in meta), len(out))


def run_sharded_semdedup(plan: SemPlan, run, n_docs: int, sample_docs: int) -> dict:
    """fit (driver) -> assign (per unit) -> dedup (per shard); returns {"drop": sorted indices, "stages": ...}."""
    plan.out.mkdir(parents=True, exist_ok=True)
    stages = {}
    start = time.perf_counter()
    fit_kmeans(plan, sample_docs, n_docs)
    stages["fit"] = {"tasks": 1, "docs_in": min(n_docs, sample_docs), "seconds": round(time.perf_counter() - start, 3)}
    for name, fn, items, pattern in (
        ("assign", assign_task, plan.units, "assign_{:05d}.json"),
        ("dedup", dedup_task, list(range(plan.n_shards)), "dedup_{:04d}.json"),
    ):
        start = time.perf_counter()
        run(functools.partial(fn, plan), items, lambda i, p=pattern: plan.out / p.format(i), desc=f"semdedup/{name}")
        stats = [json.loads((plan.out / pattern.format(i)).read_text()) for i in items]
        stages[name] = {
            "tasks": len(items),
            "seconds": round(time.perf_counter() - start, 3),
            "peak_mb_per_task": round(max((x["peak_mb"] for x in stats), default=0.0), 1),
        }
    parts = [np.load(plan.out / f"drop_{s:04d}.npy") for s in range(plan.n_shards)]
    drop = np.unique(np.concatenate(parts))
    stages["fit"].update(docs_out=n_docs, peak_mb_per_task=round(_peak_mb(), 1))  # the driver's
    stages["assign"].update(docs_in=n_docs, docs_out=n_docs)
    stages["dedup"].update(docs_in=n_docs, docs_out=n_docs - len(drop))
    return {"drop": drop, "stages": stages}


def shards_for(n_docs: int, docs_per_shard: int) -> int:
    return max(1, math.ceil(n_docs / docs_per_shard))
