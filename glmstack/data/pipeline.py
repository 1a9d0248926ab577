"""The data build: sources -> filters -> dedup -> SemDeDup -> quality buckets -> tokens -> shards (FIM: the loader).

    summary = build_dataset(PipelineConfig(), tokenizer, "runs/data")   # Python API (the speedrun calls this)
    glmstack data default --out runs/data                            # the same from the command line

Stages (research spec §2; GLM-4.5 §2.1-2.3):
  0. read     stream every source into fixed-size units of raw documents; tag the eval split; sample quality
              positives; train the quality model (driver)
  1. filter   per unit: boilerplate, length, symbols, repetition, code rules, decontamination; quality score;
              exact hash; MinHash signature (parallel)
  2. dedup    exact, then MinHash LSH, eval documents first so a train copy of an eval page is the one removed;
              then SemDeDup on prose (driver)
  3. mixture  per-source percentile buckets -> levels -> epoch multipliers -> copies per document (driver)
  4. tokenize per unit: ids + <|endoftext|> (parallel)
  5. shards   copies in a seeded shuffle order into uint32 shards for train/, one copy each for eval/, with
              (document key, copy, kind) per document; FIM is applied by the loader at sampling time (fim.py)
Parallel stages go through executor.run_units (in-process, process pool, Slurm or Ray), write per-unit files
and markers, so the output is byte-identical for any number of workers and a rerun resumes where it stopped.
"""

from __future__ import annotations

import functools
import hashlib
import heapq
import json
import pickle
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from tqdm import tqdm

from glmstack.config import to_dict, write_json
from glmstack.data.corpus import CorpusConfig
from glmstack.data.dedup import MinHashConfig
from glmstack.data.dedup_shards import make_plan, run_sharded_dedup
from glmstack.data.executor import run_units
from glmstack.data.filters import FilterConfig
from glmstack.data.fim import FIMConfig, doc_key
from glmstack.data.mixture import MixtureConfig, assign_levels, epochs_for, n_copies, unit_hash
from glmstack.data.quality import QualityConfig, QualityModel
from glmstack.data.report import Summary
from glmstack.data.semdedup import SemDedupConfig, resolve_embedder
from glmstack.data.semdedup_shards import SemPlan, run_sharded_semdedup, shards_for
from glmstack.data.shards import ShardWriter
from glmstack.data.sources import Doc, EmptyInputError, SourceConfig, SourceStats, read_hf, read_source
from glmstack.data.stages import (
    StageContext,
    embed_unit,
    filter_unit,
    save_npy,
    tokenize_unit,
    write_decontam_bloom,
    write_docs,
)


@dataclass(kw_only=True)
class PipelineConfig:
    """How `glmstack data` builds token shards (glmstack.train.config.DataConfig says what a stage trains on)."""

    sources: list[SourceConfig] = field(default_factory=lambda: [SourceConfig(name="corpus", kind="corpus")])
    # ^ what to read; kind "corpus" is the built-in offline corpus configured by `corpus`
    corpus: CorpusConfig = field(default_factory=CorpusConfig)  # the default corpus (size knob, seed, eval split)
    filters: FilterConfig = field(default_factory=FilterConfig)  # heuristic filters and decontamination
    dedup: bool = True  # exact + MinHash near-duplicate removal
    minhash: MinHashConfig = field(default_factory=MinHashConfig)  # shingles, bands x rows, threshold
    semdedup: SemDedupConfig = field(default_factory=SemDedupConfig)  # embedding dedup of prose
    quality: QualityConfig = field(default_factory=QualityConfig)  # prose classifier
    mixture: MixtureConfig = field(default_factory=MixtureConfig)  # buckets -> epochs -> copies, shuffle seed
    fim: FIMConfig = field(default_factory=FIMConfig)  # fill-in-the-middle on code, applied by the loader
    fim_enabled: bool = True  # the train split asks its loader for sampling-time FIM on code documents
    eval_fraction: float = 0.01  # held-out share of non-corpus sources (the corpus has its own)
    unit_docs: int = 256  # documents per work unit (the grain of parallelism and resumption)
    shard_tokens: int = 1 << 24  # tokens per shard file
    executor: Literal["local", "processes", "slurm", "ray", "datatrove-local"] = "local"  # where units run
    workers: int = 1  # processes (or datatrove tasks) for the parallel stages
    executor_options: dict[str, Any] = field(default_factory=dict)  # extra kwargs for datatrove's executor
    progress: bool = True  # tqdm bars (rate + ETA) and the summary table on stdout
    keep_work: bool = False  # keep the per-unit work files after a successful build
    dedup_block_docs: int = 65536  # documents per task of the sharded dedup's keys stage (dedup_shards.py)
    dedup_shard_records: int = 1 << 21  # LSH band records per dedup shard: bounds memory per shard task


def with_seed(cfg: PipelineConfig, seed: int) -> PipelineConfig:
    """A copy with every component seed set to `seed` (corpus, quality, SemDeDup, mixture, FIM)."""
    from glmstack.config import from_dict

    d = to_dict(cfg)
    for part in ("corpus", "quality", "semdedup", "mixture", "fim"):
        d[part]["seed"] = seed
    return from_dict(PipelineConfig, d)


# fields that change how a build runs but never its bytes: a rerun with other values resumes the same build
EXECUTION_FIELDS = (
    "executor",
    "workers",
    "executor_options",
    "progress",
    "keep_work",
    "dedup_block_docs",
    "dedup_shard_records",
)


# bumped when the bytes a config produces change: 2 = FIM moved from the shards to the loader
FORMAT = 2


def fingerprint(cfg: PipelineConfig, tokenizer) -> str:
    """Hash of the config (minus execution fields), the format and the tokenizer; a rerun with the same value
    resumes."""
    data = {k: v for k, v in to_dict(cfg).items() if k not in EXECUTION_FIELDS}
    h = hashlib.sha256(json.dumps({"format": FORMAT, **data}, sort_keys=True).encode())
    h.update(str(tokenizer.vocab_size).encode())
    backend = getattr(tokenizer, "backend", None)
    if backend is not None and hasattr(backend, "to_str"):
        h.update(backend.to_str().encode())
    return h.hexdigest()[:16]


def build_dataset(
    cfg: PipelineConfig, tokenizer, out_dir: str | Path, extra_sources: dict[str, Iterable[dict]] | None = None
) -> dict:
    """Build train/ and eval/ token shards under `out_dir`; returns the summary dict (also summary.json).

    `extra_sources` maps a source name to any iterable of dicts with a "text" field (e.g. a Hugging Face
    `datasets` object); they are read after `cfg.sources`.
    """
    out, fp = Path(out_dir), fingerprint(cfg, tokenizer)
    manifest = out / "manifest.json"
    if manifest.exists() and json.loads(manifest.read_text()).get("fingerprint") == fp:
        summary = json.loads((out / "summary.json").read_text())
        if cfg.progress:
            print(f"{out} is already built with this config (fingerprint {fp}); nothing to do")
        return summary
    work = _prepare(out, fp)
    ctx = StageContext(cfg=cfg, work=work, tokenizer=tokenizer, fingerprint=fp)
    summary = Summary()
    # ---- 0. read ----------------------------------------------------------------------------------------------
    n_units = _read_stage(cfg, work, summary, extra_sources or {})
    units = list(range(n_units))
    run = functools.partial(
        run_units,
        executor=cfg.executor,
        workers=cfg.workers,
        progress=cfg.progress,
        logging_dir=work / "datatrove",
        options=cfg.executor_options,
    )
    # ---- 1. filter ---------------------------------------------------------------------------------------------
    write_decontam_bloom(ctx)
    run(functools.partial(filter_unit, ctx), units, lambda u: ctx.path("report", u, "json"), desc="filter")
    rows = _gather(ctx, units, summary)
    # ---- 2. dedup ----------------------------------------------------------------------------------------------
    _dedup(ctx, units, rows, summary, run)
    _semdedup(ctx, units, rows, summary, run)
    # ---- 3. mixture --------------------------------------------------------------------------------------------
    _mixture(cfg, rows, summary)
    for u in units:
        save_npy(ctx.path("keep", u, "npy"), np.array([r["copies"] for r in rows if r["unit"] == u], np.int32))
    # ---- 4. tokenize -------------------------------------------------------------------------------------------
    run(functools.partial(tokenize_unit, ctx), units, lambda u: ctx.path("tok", u, "done"), desc="tokenize")
    # ---- 5. shards ---------------------------------------------------------------------------------------------
    _assemble(ctx, units, rows, out, summary)
    return _finish(cfg, tokenizer, out, work, fp, summary)


def _prepare(out: Path, fp: str) -> Path:
    """The work folder, wiped when it belongs to a different config (otherwise it is resumed)."""
    work = out / "work"
    stamp = work / "fingerprint"
    if work.exists() and (not stamp.exists() or stamp.read_text() != fp):
        shutil.rmtree(work)
    for split in ("train", "eval"):
        shutil.rmtree(out / split, ignore_errors=True)
    (out / "manifest.json").unlink(missing_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    stamp.write_text(fp)
    return work


def _iter_sources(cfg: PipelineConfig, extra: dict[str, Iterable[dict]], stats: dict[str, SourceStats]):
    for src in cfg.sources:
        stats[src.name] = st = SourceStats()
        for doc in read_source(src, st, cfg.corpus):
            if src.kind != "corpus":  # the corpus tags its own eval split
                doc.meta["split"] = _split(doc.id, cfg)
            yield doc
    for name, data in extra.items():
        stats[name] = st = SourceStats()
        for doc in read_hf(data, SourceConfig(name=name)):
            doc.meta["split"] = _split(doc.id, cfg)
            st.docs, st.bytes = st.docs + 1, st.bytes + len(doc.text)
            yield doc


def _split(doc_id: str, cfg: PipelineConfig) -> str:
    return "eval" if unit_hash(cfg.mixture.seed, "split", doc_id) < cfg.eval_fraction else "train"


def _read_stage(cfg: PipelineConfig, work: Path, summary: Summary, extra) -> int:
    """Stage 0: write raw units, sample quality positives, train the quality model. Resumes from read.json."""
    done = work / "read.json"
    if done.exists():
        state = json.loads(done.read_text())
        summary.sources = state["sources"]
        return state["n_units"]
    stats: dict[str, SourceStats] = {}
    positives: list[tuple[float, str]] = []  # max-heap by -hash: the k documents with the smallest hash
    buf, n_units = [], 0
    bar = tqdm(desc="read", unit="doc", disable=not cfg.progress, dynamic_ncols=True)
    for doc in _iter_sources(cfg, extra, stats):
        buf.append(doc)
        _sample_positive(doc, positives, cfg)
        bar.update()
        if len(buf) == cfg.unit_docs:
            write_docs(work / f"raw_{n_units:05d}.jsonl.zst", buf)
            buf, n_units = [], n_units + 1
    if buf:
        write_docs(work / f"raw_{n_units:05d}.jsonl.zst", buf)
        n_units += 1
    bar.close()
    summary.sources = {k: vars(v) for k, v in stats.items()}
    if n_units == 0:
        where = ", ".join(f"{s.name} ({s.kind} {s.path})".strip() for s in cfg.sources) or "no sources configured"
        raise EmptyInputError(f"no documents were read from: {where}" + _error_hint(summary.sources))
    _train_quality(cfg, work, [t for _, t in sorted(positives, key=lambda p: -p[0])], summary)
    done.write_text(json.dumps({"n_units": n_units, "sources": summary.sources}))
    return n_units


def _error_hint(sources: dict) -> str:
    errs = [e for s in sources.values() for e in s["errors"][:3]]
    return ("; first errors: " + "; ".join(errs)) if errs else ""


def _sample_positive(doc: Doc, heap: list, cfg: PipelineConfig) -> None:
    if doc.kind != "text" or doc.meta["split"] != "train" or not cfg.quality.enabled:
        return
    key = unit_hash(cfg.quality.seed, "positive", doc.id)
    if len(heap) < cfg.quality.max_train_docs:
        heapq.heappush(heap, (-key, doc.text))
    elif -heap[0][0] > key:
        heapq.heapreplace(heap, (-key, doc.text))


def _train_quality(cfg: PipelineConfig, work: Path, positives: list[str], summary: Summary) -> None:
    if not cfg.quality.enabled or len(positives) < 10:
        summary.quality = {"trained": False, "positives": len(positives)}
        return
    model = QualityModel(cfg.quality)
    summary.quality = {"trained": True, **model.fit(positives)}
    (work / "quality.pkl").write_bytes(pickle.dumps(model))


def _gather(ctx: StageContext, units: list[int], summary: Summary) -> list[dict]:
    """One row per kept document, in canonical (unit, position) order; merges the filter reports."""
    rows = []
    for u in units:
        summary.add_filter_report(json.loads(ctx.path("report", u, "json").read_text()))
        for j, (doc_id, source, kind, split, q, chars) in enumerate(
            json.loads(ctx.path("meta", u, "json").read_text())
        ):
            rows.append(
                {
                    "unit": u,
                    "pos": j,
                    "id": doc_id,
                    "source": source,
                    "kind": kind,
                    "split": split,
                    "quality": q,
                    "chars": chars,
                    "drop": None,
                    "copies": 0,
                    "level": None,
                }
            )
    return rows


def _dedup(ctx: StageContext, units: list[int], rows: list[dict], summary: Summary, run) -> None:
    """Exact + MinHash as sharded disk-based stages on the executor; decisions as dedup.dedup_decisions would make
    them over the canonical order (eval first, then read order), so a train copy of an eval page loses."""
    if not ctx.cfg.dedup:
        return
    order = sorted(range(len(rows)), key=lambda i: rows[i]["split"] != "eval")  # eval first, then stable
    rank = np.empty(len(rows), np.int64)
    rank[order] = np.arange(len(rows))
    counts = [0] * len(units)
    for r in rows:
        counts[r["unit"]] += 1
    start = 0
    for u in units:
        save_npy(ctx.path("rank", u, "npy"), rank[start : start + counts[u]])
        start += counts[u]
    plan = make_plan(
        ctx.work, ctx.work / "dedup", counts, ctx.cfg.minhash, ctx.cfg.dedup_block_docs, ctx.cfg.dedup_shard_records
    )
    result = run_sharded_dedup(plan, run)
    for why in ("exact", "minhash"):
        for i in np.asarray(order)[result[why]].tolist():
            rows[i]["drop"] = why
            summary.count_drop(why, rows[i])
    summary.stages.update({f"dedup/{k}": v for k, v in result["stages"].items()})


def _semdedup(ctx: StageContext, units: list[int], rows: list[dict], summary: Summary, run) -> None:
    """SemDeDup of the prose that survived dedup, as sharded stages (semdedup_shards.py): the in-memory path's
    decisions while the prose fits one k-means sample (semdedup.sample_docs)."""
    cfg = ctx.cfg.semdedup
    if not cfg.enabled:
        return
    idx = [i for i, r in enumerate(rows) if r["kind"] == "text" and r["drop"] is None]
    if len(idx) < 2:
        return
    by_unit: dict[int, list[int]] = {u: [] for u in units}
    for k, i in enumerate(idx):
        by_unit[rows[i]["unit"]].append(k)
    for u in units:
        save_npy(ctx.path("sem_pos", u, "npy"), np.array([rows[idx[k]]["pos"] for k in by_unit[u]], np.int64))
        save_npy(ctx.path("sem_idx", u, "npy"), np.array(by_unit[u], np.int64))
    start = time.perf_counter()
    run(functools.partial(embed_unit, ctx), units, lambda u: ctx.path("emb", u, "json"), desc="semdedup/embed")
    stats = [json.loads(ctx.path("emb", u, "json").read_text()) for u in units]
    embedder = resolve_embedder(cfg)
    plan = SemPlan(
        work=ctx.work, units=units, cfg=cfg, embedder=embedder, n_shards=shards_for(len(idx), cfg.shard_docs)
    )
    result = run_sharded_semdedup(plan, run, len(idx), cfg.sample_docs)
    summary.stages["semdedup/embed"] = {
        "tasks": len(units),
        "docs_in": len(idx),
        "docs_out": len(idx),
        "seconds": round(time.perf_counter() - start, 3),
        "peak_mb_per_task": round(max(s["peak_mb"] for s in stats), 1),
        "embedder": embedder,
    }
    summary.stages.update({f"semdedup/{k}": v for k, v in result["stages"].items()})
    for k in result["drop"].tolist():
        rows[idx[k]]["drop"] = "semdedup"
        summary.count_drop("semdedup", rows[idx[k]])


def _mixture(cfg: PipelineConfig, rows: list[dict], summary: Summary) -> None:
    """Levels from per-source percentiles of the surviving train documents, then copies by seeded hash."""
    live = [r for r in rows if r["drop"] is None and r["split"] == "train"]
    levels = assign_levels([r["source"] for r in live], [r["quality"] for r in live], cfg.mixture)
    for r, level in zip(live, levels):
        r["level"] = level
        r["epochs"] = epochs_for(r["source"], level, cfg.mixture)
        r["copies"] = n_copies(r["id"], r["epochs"], cfg.mixture.seed)
        if r["copies"] == 0:
            r["drop"] = "quality: level epochs 0" if r["epochs"] == 0 else "quality: fractional draw"
            summary.count_drop(r["drop"], r)
    for r in rows:
        if r["drop"] is None and r["split"] == "eval":
            r["copies"] = 1


def _assemble(ctx: StageContext, units: list[int], rows: list[dict], out: Path, summary: Summary) -> None:
    """Write train/ (copies, seeded shuffle) and eval/ (canonical order) from the per-unit token files."""
    tok = {u: _map_tokens(ctx.path("tok", u, "bin")) for u in units}
    off = {u: np.load(ctx.path("tok", u, "idx.npy")) for u in units}
    local: dict[int, int] = {}
    entries: dict[str, list] = {"train": [], "eval": []}
    for r in rows:
        if r["copies"] > 0:
            j = local.get(r["unit"], 0)
            local[r["unit"]] = j + 1
            ntok = int(off[r["unit"]][j + 1] - off[r["unit"]][j])
            summary.count_tokens(r, ntok)
            for k in range(r["copies"]):
                key = unit_hash(ctx.cfg.mixture.seed, "shuffle", r["id"], k) if r["split"] == "train" else 0.0
                entries[r["split"]].append((key, r["unit"], j, (doc_key(r["id"]), k, r["kind"])))
    eos, vocab = ctx.tokenizer.token_id("<|endoftext|>"), ctx.tokenizer.vocab_size
    # FIM happens in the loader (fim.ContextFIM), on code of the train split, with this config
    fim = {"train": to_dict(ctx.cfg.fim) if ctx.cfg.fim_enabled else None, "eval": None}
    for split, ents in entries.items():
        if split == "train":
            ents.sort()
        writer = ShardWriter(out / split, ctx.cfg.shard_tokens, eos, vocab)
        bar = tqdm(ents, desc=f"shards/{split}", unit="doc", disable=not ctx.cfg.progress, dynamic_ncols=True)
        for _, u, j, doc in bar:
            writer.add(tok[u][off[u][j] : off[u][j + 1]], doc)
        summary.splits[split] = writer.close(split=split, fim=fim[split])


def _map_tokens(path: Path) -> np.ndarray:
    """Memory-map a unit's tokens (bounded memory); an empty file cannot be mapped."""
    return np.memmap(path, dtype=np.uint32, mode="r") if path.stat().st_size else np.zeros(0, np.uint32)


def _finish(cfg: PipelineConfig, tokenizer, out: Path, work: Path, fp: str, summary: Summary) -> dict:
    if hasattr(tokenizer, "save"):
        tokenizer.save(out / "tokenizer")
    data = summary.to_dict(cfg.mixture)
    (out / "summary.json").write_text(json.dumps(data, indent=1) + "\n")
    (out / "mixture.json").write_text(json.dumps(data["mixture"], indent=1) + "\n")
    write_json(cfg, out / "config.json")
    if not cfg.keep_work:
        shutil.rmtree(work, ignore_errors=True)
    (out / "manifest.json").write_text(json.dumps({"fingerprint": fp, "splits": ["train", "eval"]}) + "\n")
    if cfg.progress:
        print(summary.table())
    return data
