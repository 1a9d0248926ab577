"""Sharded, disk-based exact + MinHash dedup: the in-memory path's decisions with any executor and worker count,
and a task killed mid-stage is redone on rerun with byte-identical files."""

import functools
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from glmstack.data.corpus import CorpusConfig, corpus_docs
from glmstack.data.dedup import MinHashConfig, MinHasher, dedup_decisions, exact_hash
from glmstack.data.dedup_shards import decisions_from, make_plan, run_sharded_dedup, write_units
from glmstack.data.executor import run_units

CFG = MinHashConfig()


def planted_corpus(seed: int = 0, size_mb: float = 0.4) -> list[str]:
    """Corpus documents, some followed by a near-copy (5% of words replaced) or a case-changed exact copy."""
    rng, out = random.Random(seed), []
    for doc in corpus_docs(CorpusConfig(size_mb=size_mb)):
        out.append(doc.text)
        r = rng.random()
        if r < 0.2:
            words = doc.text.split()
            for _ in range(max(1, len(words) // 20)):
                words[rng.randrange(len(words))] = "zz"
            out.append(" ".join(words))
        elif r < 0.3:
            out.append(doc.text.upper())
    return out


@pytest.fixture(scope="module")
def corpus_inputs(tmp_path_factory):
    texts = planted_corpus()
    hasher = MinHasher(CFG)
    sigs = np.stack([hasher.signature(t) for t in texts])
    hashes = np.array([list(exact_hash(t)) for t in texts], np.uint8)
    inputs = tmp_path_factory.mktemp("inputs")
    counts = write_units(inputs, sigs, hashes, unit_docs=37)
    ref = dedup_decisions([h.tobytes() for h in hashes], list(sigs), CFG)
    return inputs, counts, ref


def sharded(inputs: Path, work: Path, counts, executor="local", workers=1, cfg=CFG, **plan_kw):
    plan = make_plan(inputs, work, counts, cfg, **{"block_docs": 60, "shard_records": 500, **plan_kw})
    run = functools.partial(run_units, executor=executor, workers=workers, progress=False)
    return plan, run_sharded_dedup(plan, run)


@pytest.mark.parametrize("executor,workers", [("local", 1), ("processes", 2), ("processes", 4)])
def test_sharded_decisions_equal_the_in_memory_path(corpus_inputs, tmp_path, executor, workers):
    inputs, counts, ref = corpus_inputs
    plan, result = sharded(inputs, tmp_path, counts, executor, workers)
    assert plan.n_shards > 4 and len(plan.blocks) > 3  # the merge across blocks and shards is exercised
    assert decisions_from(result, sum(counts)) == ref
    assert ref.count("exact") > 5 and ref.count("minhash") > 5
    st_ = result["stages"]
    assert st_["minhash"]["docs_out"] == ref.count(None) and st_["exact"]["tasks"] == plan.n_shards


@settings(max_examples=25, deadline=None)
@given(st.data())
def test_colliding_signatures_give_the_in_memory_decisions(tmp_path_factory, data):
    # values from a tiny alphabet: many shared bands, agreements near the threshold, chains A~C, B~C with A!~B
    cfg = MinHashConfig(bands=4, rows=2, threshold=0.5)
    n = data.draw(st.integers(2, 40))
    sigs = np.array(data.draw(st.lists(st.lists(st.integers(0, 2), min_size=8, max_size=8), min_size=n, max_size=n)))
    hashes = np.zeros((n, 16), np.uint8)
    hashes[:, 0] = data.draw(st.lists(st.integers(0, n), min_size=n, max_size=n))
    ref = dedup_decisions([h.tobytes() for h in hashes], list(sigs.astype(np.uint64)), cfg)
    tmp = tmp_path_factory.mktemp("prop")
    counts = write_units(tmp / "in", sigs.astype(np.uint64), hashes, unit_docs=data.draw(st.integers(1, 9)))
    big = data.draw(st.integers(0, 1))  # small groups (all pairs at once) or the member-by-member path
    import glmstack.data.dedup_shards as ds

    old, ds.SMALL_GROUP = ds.SMALL_GROUP, (1 if big else 32)
    try:
        _, result = sharded(tmp / "in", tmp / "work", counts, cfg=cfg, block_docs=7, shard_records=8)
    finally:
        ds.SMALL_GROUP = old
    assert decisions_from(result, n) == ref


KILL_SCRIPT = """
import functools, sys
from pathlib import Path
from glmstack.data.dedup import MinHashConfig
from glmstack.data.dedup_shards import make_plan, run_sharded_dedup
from glmstack.data.executor import run_units
inputs, work, counts = Path(sys.argv[1]), Path(sys.argv[2]), [int(x) for x in sys.argv[3].split(",")]
plan = make_plan(inputs, work, counts, MinHashConfig(), block_docs=2000, shard_records=20000)
run_sharded_dedup(plan, functools.partial(run_units, executor="local", progress=False))
"""


def _files(work: Path) -> dict:
    return {str(p.relative_to(work)): p.read_bytes() for p in sorted(work.rglob("*.npy")) if p.is_file()}


def test_a_task_killed_mid_stage_is_redone_with_identical_bytes(tmp_path):
    rng = np.random.default_rng(0)
    n = 40_000
    sigs = rng.integers(0, 2**63, size=(n, 100), dtype=np.uint64)
    sigs[1::10] = sigs[::10]  # near-duplicates: every tenth document copied, then 10 positions changed
    sigs[1::10, :10] += np.uint64(1)
    hashes = rng.integers(0, 256, size=(n, 16), dtype=np.uint8)
    hashes[7::50] = hashes[3::50]
    counts = write_units(tmp_path / "in", sigs, hashes, unit_docs=500)
    args = [str(tmp_path / "in"), None, ",".join(map(str, counts))]
    script = [sys.executable, "-c", KILL_SCRIPT]
    subprocess.run(script + [args[0], str(tmp_path / "ref"), args[2]], check=True)
    work = tmp_path / "killed"
    proc = subprocess.Popen(script + [args[0], str(work), args[2]])
    deadline = time.monotonic() + 120
    while not (work / "keys_00003.json").exists() and time.monotonic() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (work / "minhash_0000.json").exists()  # killed before the last stage finished
    _, result = sharded(tmp_path / "in", work, counts, block_docs=2000, shard_records=20000)
    ref = _files(tmp_path / "ref")
    assert _files(work) == ref and len(ref) > 100
    assert not list(work.rglob(".*.tmp-*"))
    assert len(result["minhash"]) == n // 10 and len(result["exact"]) == n // 50


@pytest.fixture(scope="module")
def semdedup_texts():
    docs = list(corpus_docs(CorpusConfig(size_mb=0.6, seed=1), split="all"))
    return [d.text for d in docs if d.source in ("templates", "pydoc")]


@pytest.mark.parametrize("executor,workers", [("local", 1), ("processes", 2), ("processes", 4)])
def test_sharded_semdedup_equals_the_in_memory_path(semdedup_texts, tmp_path, executor, workers):
    from glmstack.data.semdedup import SemDedupConfig, hashed_embed, semdedup_drops
    from glmstack.data.semdedup_shards import SemPlan, run_sharded_semdedup, save_rows

    cfg = SemDedupConfig(embedder="hashed")
    texts = semdedup_texts
    ref = np.flatnonzero(semdedup_drops(texts, cfg))
    units = list(range(0, len(texts), 29))
    for u, a in enumerate(units):  # embeddings written per unit, as the pipeline's embed stage does
        save_rows(tmp_path / f"emb_{u:05d}", hashed_embed(texts[a : a + 29], cfg.n_features))
        np.save(tmp_path / f"sem_idx_{u:05d}.npy", np.arange(a, min(a + 29, len(texts))))
    plan = SemPlan(work=tmp_path, units=list(range(len(units))), cfg=cfg, embedder="hashed", n_shards=3)
    run = functools.partial(run_units, executor=executor, workers=workers, progress=False)
    result = run_sharded_semdedup(plan, run, len(texts), sample_docs=10**6)
    assert len(ref) > 20 and result["drop"].tolist() == ref.tolist()
    assert result["stages"]["dedup"]["docs_out"] == len(texts) - len(ref)
