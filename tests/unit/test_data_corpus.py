"""The default corpus: deterministic from a seed, held-out eval split disjoint from train, size knob works."""

from collections import Counter

from glmstack.data.corpus import CorpusConfig, corpus_docs


def test_deterministic_and_split_disjoint():
    cfg = CorpusConfig(size_mb=0.3, seed=5, eval_fraction=0.1)
    a = [(d.id, d.text) for d in corpus_docs(cfg, "train")]
    assert a == [(d.id, d.text) for d in corpus_docs(cfg, "train")]
    ev = {d.id for d in corpus_docs(cfg, "eval")}
    assert ev and not ev & {i for i, _ in a}
    assert len(ev) + len(a) == len(list(corpus_docs(cfg, "all")))


def test_parts_and_size_knob():
    small = list(corpus_docs(CorpusConfig(size_mb=0.2), "all"))
    big = list(corpus_docs(CorpusConfig(size_mb=1.0), "all"))
    assert set(Counter(d.source for d in small)) == {
        "stdlib-code",
        "stdlib-repos",
        "pydoc",
        "docstrings",
        "math",
        "templates",
    }
    size = lambda docs: sum(len(d.text) for d in docs)
    assert size(small) < 0.4e6 and 0.7e6 < size(big) < 1.4e6
    kinds = {d.source: d.kind for d in big}
    assert kinds["stdlib-repos"] == "repo" and kinds["stdlib-code"] == "code" and kinds["math"] == "math"
    repo = next(d for d in big if d.kind == "repo")
    assert repo.text.startswith("<|repo_name|>") and "<|file_sep|>" in repo.text
    assert "Answer:" in next(d for d in big if d.kind == "math").text


def test_seed_changes_the_corpus():
    a = [d.id for d in corpus_docs(CorpusConfig(size_mb=0.3, seed=0), "all")]
    b = [d.id for d in corpus_docs(CorpusConfig(size_mb=0.3, seed=1), "all")]
    assert a != b


def test_every_part_has_a_held_out_document_even_when_tiny():
    docs = list(corpus_docs(CorpusConfig(size_mb=0.2, seed=3), "eval"))
    assert {"stdlib-code", "pydoc", "docstrings", "math"} <= {d.source for d in docs}
