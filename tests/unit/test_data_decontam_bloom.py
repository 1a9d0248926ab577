"""The n-gram Bloom filter every filter task loads: no false negatives, about its configured false-positive rate,
and decontamination decisions identical to the exact n-gram table alone."""

import random

import numpy as np

from glmstack.data.corpus import CorpusConfig, corpus_docs
from glmstack.data.decontam import Decontaminator, NgramBloom, humaneval_texts, ngram_hashes
from glmstack.data.filters import words
from glmstack.data.sources import Doc


def test_bloom_has_no_false_negatives_and_a_low_false_positive_rate(tmp_path):
    evals = {"HumanEval": humaneval_texts()}
    NgramBloom.build(evals, 13, fp_rate=1e-3).save(tmp_path / "b.npy")
    bloom = NgramBloom.load(tmp_path / "b.npy")
    assert isinstance(bloom.bits, np.memmap)
    inside = np.concatenate([ngram_hashes(words(t.lower()), 13, {}) for t in evals["HumanEval"]])
    assert len(inside) > 10_000 and bloom.maybe(inside).all()
    outside = np.random.default_rng(0).integers(0, 2**63, size=200_000, dtype=np.uint64)
    assert bloom.maybe(outside).mean() < 3e-3


def test_decisions_with_the_bloom_filter_equal_the_exact_table():
    evals = {"HumanEval": humaneval_texts()}
    rng = random.Random(0)
    docs = [
        Doc(id=str(i), text=d.text, source="c", kind=d.kind)
        for i, d in enumerate(corpus_docs(CorpusConfig(size_mb=0.2)))
    ]
    for i in range(0, len(docs), 7):  # plant a slice of a HumanEval solution in every seventh document
        src = words(rng.choice(evals["HumanEval"]))
        a = rng.randrange(max(1, len(src) - 14))
        docs[i].text += "\n" + " ".join(src[a : a + rng.choice((12, 13, 20))])
    exact = Decontaminator(evals, 13)
    bloomed = Decontaminator(lambda: evals, 13, bloom=NgramBloom.build(evals, 13, fp_rate=0.05))
    got, want = [bloomed(d) for d in docs], [exact(d) for d in docs]
    assert got == want and sum(w is not None for w in want) > 5
