"""Decontamination as the build runs it (the driver's Bloom filter, loaded by every filter task): the documents it
removes are exactly the in-memory exact-table decisions, with 1, 2 and 4 workers (local and process executors here;
the Ray executor in tests/dist/test_data_ray.py)."""

import functools
import json
import random
from pathlib import Path

import pytest

from glmstack.data.corpus import CorpusConfig, corpus_docs
from glmstack.data.decontam import Decontaminator, default_eval_texts
from glmstack.data.executor import run_units
from glmstack.data.filters import FilterReport, apply_filters, build_filters
from glmstack.data.pipeline import PipelineConfig
from glmstack.data.sources import Doc
from glmstack.data.stages import StageContext, filter_unit, read_docs, write_decontam_bloom, write_docs

UNIT_DOCS = 25


def contaminated_docs(seed: int = 0) -> list[Doc]:
    """Corpus documents with benchmark passages (HumanEval prompts, BFCL questions) pasted into some of them."""
    rng = random.Random(seed)
    evals = [t for texts in default_eval_texts().values() for t in texts if len(t.split()) > 30]
    docs = list(corpus_docs(CorpusConfig(size_mb=0.15, seed=seed), split="all"))
    for i in rng.sample(range(len(docs)), 12):
        d = docs[i]
        docs[i] = Doc(id=d.id, text=d.text + "\n\n" + rng.choice(evals), source=d.source, kind=d.kind, meta=d.meta)
    return docs


def write_raw_units(work: Path, docs: list[Doc]) -> StageContext:
    ctx = StageContext(cfg=PipelineConfig(corpus=CorpusConfig(size_mb=0.15), progress=False), work=work)
    work.mkdir(parents=True, exist_ok=True)
    for u, a in enumerate(range(0, len(docs), UNIT_DOCS)):
        write_docs(ctx.path("raw", u, "jsonl.zst"), docs[a : a + UNIT_DOCS])
    write_decontam_bloom(ctx)
    return ctx


def stage_decisions(ctx: StageContext, n_units: int) -> tuple[list[str], int]:
    """The ids every filter task kept, in order, and how many documents decontamination removed."""
    kept = [d.id for u in range(n_units) for d in read_docs(ctx.path("kept", u, "jsonl.zst"))]
    reports = [json.loads(ctx.path("report", u, "json").read_text()) for u in range(n_units)]
    return kept, sum(r["removed"].get("decontamination", 0) for r in reports)


def run_filter_stage(ctx: StageContext, n_units: int, **executor) -> None:
    fn = functools.partial(filter_unit, ctx)
    run_units(fn, list(range(n_units)), lambda u: ctx.path("report", u, "json"), progress=False, **executor)


def in_memory_decisions(docs: list[Doc]) -> tuple[list[str], set[str]]:
    """Kept ids with the exact n-gram table (no Bloom filter) in one process, and the ids it calls contaminated."""
    cfg = PipelineConfig().filters
    exact = Decontaminator(default_eval_texts(), cfg.decontam_n)
    filters = build_filters(cfg, exact)
    kept = [d.id for d in docs if apply_filters(d, cfg, filters, FilterReport())]
    return kept, {d.id for d in docs if exact(d)}


@pytest.fixture(scope="module")
def planted():
    docs = contaminated_docs()
    return docs, *in_memory_decisions(docs)


@pytest.mark.parametrize("executor,workers", [("local", 1), ("processes", 2), ("processes", 4)])
def test_sharded_decontamination_equals_the_in_memory_decisions(planted, tmp_path, executor, workers):
    docs, ref_kept, contaminated = planted
    n_units = -(-len(docs) // UNIT_DOCS)
    ctx = write_raw_units(tmp_path, docs)
    run_filter_stage(ctx, n_units, executor=executor, workers=workers)
    kept, n_decontam = stage_decisions(ctx, n_units)
    assert kept == ref_kept
    assert len(contaminated) >= 12 and n_decontam >= 10 and not contaminated & set(kept)
