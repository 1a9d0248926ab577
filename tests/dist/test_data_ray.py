"""The data build on a local Ray cluster (datatrove's RayPipelineExecutor): the same bytes as in-process; the sharded
dedup's, SemDeDup's and decontamination's in-memory decisions with 1, 2 and 4 tasks; a failing task fails the build at
once with its log path instead of leaving the driver waiting on markers."""

import functools
import hashlib
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from glmstack.data.corpus import CorpusConfig, corpus_docs
from glmstack.data.executor import DataTaskError
from glmstack.data.pipeline import PipelineConfig, build_dataset

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.dist, pytest.mark.slow]

RAY = {"executor": "ray", "workers": 2, "executor_options": {"mem_per_cpu_gb": 0.25}}


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=80 * 1024**2, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def tok():
    from glmstack.tokenizer import Tokenizer

    return Tokenizer.train((d.text for d in corpus_docs(CorpusConfig(size_mb=0.1))), 400)


@pytest.fixture(scope="module")
def local_build(tmp_path_factory, tok):
    out = tmp_path_factory.mktemp("local")
    build_dataset(_cfg(keep_work=True), tok, out)
    return out


def _cfg(**kw):
    return PipelineConfig(**{"corpus": CorpusConfig(size_mb=0.1), "unit_docs": 32, "progress": False, **kw})


def _digest(out: Path) -> dict:
    return {
        str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
        for split in ("train", "eval")
        for p in sorted((out / split).iterdir())
    }


def test_ray_executor_gives_the_local_bytes(cluster, tok, local_build, tmp_path):
    build_dataset(_cfg(**RAY), tok, tmp_path)
    assert _digest(tmp_path) == _digest(local_build)


def test_sharded_dedup_on_ray_gives_the_in_memory_decisions(cluster, tmp_path):
    from glmstack.data.dedup import MinHasher, dedup_decisions, exact_hash
    from glmstack.data.dedup_shards import decisions_from, make_plan, run_sharded_dedup, write_units
    from glmstack.data.executor import run_units
    from tests.integration.test_dedup_shards import CFG, planted_corpus

    texts = planted_corpus(size_mb=0.2)
    hasher = MinHasher(CFG)
    sigs = np.stack([hasher.signature(t) for t in texts])
    hashes = np.array([list(exact_hash(t)) for t in texts], np.uint8)
    ref = dedup_decisions([h.tobytes() for h in hashes], list(sigs), CFG)
    counts = write_units(tmp_path / "in", sigs, hashes, unit_docs=37)
    for workers in (1, 2, 4):
        plan = make_plan(tmp_path / "in", tmp_path / f"w{workers}", counts, CFG, block_docs=40, shard_records=400)
        run = functools.partial(
            run_units,
            executor="ray",
            workers=workers,
            progress=False,
            logging_dir=tmp_path / f"logs{workers}",
            options=RAY["executor_options"],
        )
        assert decisions_from(run_sharded_dedup(plan, run), len(texts)) == ref
    assert plan.n_shards >= 4 and ref.count("minhash") > 2 and ref.count("exact") > 2


def test_sharded_semdedup_on_ray_gives_the_in_memory_decisions(cluster, tmp_path):
    from glmstack.data.executor import run_units
    from glmstack.data.semdedup import SemDedupConfig, hashed_embed, semdedup_drops
    from glmstack.data.semdedup_shards import SemPlan, run_sharded_semdedup, save_rows

    docs = corpus_docs(CorpusConfig(size_mb=0.6, seed=1), split="all")
    texts = [d.text for d in docs if d.source in ("templates", "pydoc")]
    cfg = SemDedupConfig(embedder="hashed")
    ref = np.flatnonzero(semdedup_drops(texts, cfg)).tolist()
    starts = list(range(0, len(texts), 40))
    for u, a in enumerate(starts):
        save_rows(tmp_path / f"emb_{u:05d}", hashed_embed(texts[a : a + 40], cfg.n_features))
        np.save(tmp_path / f"sem_idx_{u:05d}.npy", np.arange(a, min(a + 40, len(texts))))
    for workers in (1, 2, 4):
        work = tmp_path / f"w{workers}"
        work.mkdir()
        for p in tmp_path.glob("*_0*.np*"):
            shutil.copy(p, work / p.name)
        plan = SemPlan(work=work, units=list(range(len(starts))), cfg=cfg, embedder="hashed", n_shards=4)
        run = functools.partial(
            run_units,
            executor="ray",
            workers=workers,
            progress=False,
            logging_dir=work / "logs",
            options=RAY["executor_options"],
        )
        assert run_sharded_semdedup(plan, run, len(texts), sample_docs=10**6)["drop"].tolist() == ref
    assert len(ref) > 20


def test_decontamination_on_ray_gives_the_in_memory_decisions(cluster, tmp_path):
    from tests.integration.test_decontam_shards import (
        UNIT_DOCS,
        contaminated_docs,
        in_memory_decisions,
        run_filter_stage,
        stage_decisions,
        write_raw_units,
    )

    docs = contaminated_docs()
    ref_kept, contaminated = in_memory_decisions(docs)
    n_units = -(-len(docs) // UNIT_DOCS)
    for workers in (1, 2, 4):
        ctx = write_raw_units(tmp_path / f"w{workers}", docs)
        options = {"logging_dir": ctx.work / "logs", "options": RAY["executor_options"]}
        run_filter_stage(ctx, n_units, executor="ray", workers=workers, **options)
        kept, n_decontam = stage_decisions(ctx, n_units)
        assert kept == ref_kept and n_decontam >= 10 and not contaminated & set(kept)


def test_a_failing_ray_task_fails_the_build_with_its_log(cluster, tok, local_build, tmp_path):
    # resume the finished build's work folder with one unit's raw file gone: that unit's filter task raises
    out = tmp_path / "out"
    shutil.copytree(local_build, out)
    (out / "manifest.json").unlink()
    for marker in (out / "work").glob("report_*.json"):
        marker.unlink()
    (out / "work" / "raw_00001.jsonl.zst").unlink()
    start = time.monotonic()
    with pytest.raises(DataTaskError) as err:
        build_dataset(_cfg(**RAY), tok, out)
    assert time.monotonic() - start < 60
    message = str(err.value)
    assert "FileNotFoundError" in message and "raw_00001.jsonl.zst" in message
    log = Path(message.rsplit("log: ", 1)[1])
    assert log.exists() and "raw_00001" in log.read_text()
