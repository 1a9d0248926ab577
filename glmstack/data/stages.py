"""The per-unit stages of the build (run by executor.run_units) and their file formats.

Work folder layout (one file set per unit u, the marker written last):
    raw_{u}.jsonl.zst                 documents as read (stage 0, driver)
    kept_{u}.jsonl.zst                documents that passed the filters, with their quality score (stage 1)
    sig_{u}.npy / hash_{u}.npy        MinHash signatures and exact hashes of the kept documents (stage 1)
    meta_{u}.json                     [id, source, kind, split, quality, chars] per kept document (stage 1)
    report_{u}.json                   filter report; the stage-1 marker
    decontam_bloom.npy (+ .json)      evaluation n-gram Bloom filter every filter task loads (driver, once)
    rank_{u}.npy, dedup/              canonical rank per kept document; the sharded dedup's files (dedup_shards.py)
    keep_{u}.npy                      copies per kept document after dedup + mixture (driver)
    tok_{u}.bin / tok_{u}.idx.npy     tokens of the surviving documents (stage 2); tok_{u}.done marker
"""

from __future__ import annotations

import io
import json
import pickle
import resource
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from glmstack.atomic import write_atomic
from glmstack.data.dedup import MinHasher, exact_hash
from glmstack.data.filters import FilterReport, apply_filters, build_filters
from glmstack.data.quality import code_score
from glmstack.data.sources import Doc


def write_docs(path: Path, docs: list[Doc]) -> None:
    import zstandard

    raw = "".join(json.dumps(d.to_json(), ensure_ascii=False) + "\n" for d in docs).encode("utf-8", "replace")
    write_atomic(path, zstandard.ZstdCompressor(level=3).compress(raw))


def read_docs(path: Path) -> list[Doc]:
    import zstandard

    with zstandard.ZstdDecompressor().stream_reader(open(path, "rb")) as r:
        text = io.TextIOWrapper(r, encoding="utf-8")
        return [Doc.from_json(json.loads(line)) for line in text if line.strip()]


def save_npy(path: Path, arr: np.ndarray) -> None:
    write_atomic(path, lambda tmp: np.save(tmp, arr))


@dataclass
class StageContext:
    """Everything a unit function needs; pickled once per worker process."""

    cfg: object  # PipelineConfig
    work: Path
    tokenizer: object = None
    fingerprint: str = ""  # of config + tokenizer; keys the per-process caches

    def path(self, kind: str, u: int, ext: str) -> Path:
        return self.work / f"{kind}_{u:05d}.{ext}"


_CACHE: dict[str, object] = {}


def _cached(ctx: StageContext, key: str, make):
    key = f"{ctx.work}:{ctx.fingerprint}:{key}"
    if key not in _CACHE:
        _CACHE[key] = make()
    return _CACHE[key]


def filter_unit(ctx: StageContext, u: int) -> None:
    """Stage 1: filters, decontamination, quality score, exact hash and MinHash signature of one unit."""
    cfg = ctx.cfg
    filters = _cached(ctx, "filters", lambda: build_filters(cfg.filters, _decontaminator(ctx)))
    hasher = _cached(ctx, "minhash", lambda: MinHasher(cfg.minhash))
    quality = _cached(ctx, "quality", lambda: _load_quality(ctx.work))
    report, kept = FilterReport(), []
    for doc in read_docs(ctx.path("raw", u, "jsonl.zst")):
        if apply_filters(doc, cfg.filters, filters, report):
            kept.append(doc)
    _score(kept, quality)
    sigs = np.stack([hasher.signature(d.text) for d in kept]) if kept else np.zeros((0, hasher.num_perm), np.uint64)
    hashes = np.array([list(exact_hash(d.text)) for d in kept], dtype=np.uint8).reshape(len(kept), 16)
    write_docs(ctx.path("kept", u, "jsonl.zst"), kept)
    meta = [[d.id, d.source, d.kind, d.meta.get("split", "train"), d.meta.get("quality"), len(d.text)] for d in kept]
    ctx.path("meta", u, "json").write_text(json.dumps(meta))
    save_npy(ctx.path("sig", u, "npy"), sigs)
    save_npy(ctx.path("hash", u, "npy"), hashes)
    rep = {
        "removed": dict(report.removed),
        "reasons": dict(report.reasons),
        "by_source": dict(report.by_source),
        "boilerplate_lines": report.boilerplate_lines,
        "kept": len(kept),
    }
    write_atomic(ctx.path("report", u, "json"), json.dumps(rep))


def write_decontam_bloom(ctx: StageContext) -> None:
    """Driver, once per build: the evaluation sets' n-gram Bloom filter that every filter task loads."""
    from glmstack.data.decontam import NgramBloom, default_eval_texts

    path = ctx.work / "decontam_bloom.npy"
    if ctx.cfg.filters.decontaminate and not path.exists():
        NgramBloom.build(default_eval_texts(), ctx.cfg.filters.decontam_n).save(path)


def _decontaminator(ctx: StageContext):
    """The task's decontamination filter: the driver's Bloom filter (memory-mapped); exact n-grams on first hit."""
    if not ctx.cfg.filters.decontaminate:
        return None
    from glmstack.data.decontam import Decontaminator, NgramBloom, default_eval_texts

    bloom = NgramBloom.load(ctx.work / "decontam_bloom.npy")
    return Decontaminator(default_eval_texts, ctx.cfg.filters.decontam_n, bloom=bloom)


def _load_quality(work: Path):
    path = work / "quality.pkl"
    return pickle.loads(path.read_bytes()) if path.exists() else None


def _score(docs: list[Doc], quality) -> None:
    """meta["quality"]: classifier probability for prose, rule score for code, none for math."""
    prose = [d for d in docs if d.kind == "text"]
    if quality is not None and prose:
        for d, s in zip(prose, quality.score([d.text for d in prose])):
            d.meta["quality"] = float(s)
    for d in docs:
        if d.kind in ("code", "repo"):
            d.meta["quality"] = code_score(d.text, d.lang)


def tokenize_unit(ctx: StageContext, u: int) -> None:
    """Stage 2: tokens + <|endoftext|> of the unit's surviving documents (copies are made when shards are
    assembled; FIM is applied later, by the loader, at sampling time)."""
    keep = np.load(ctx.path("keep", u, "npy"))
    docs = [d for d, k in zip(read_docs(ctx.path("kept", u, "jsonl.zst")), keep) if k > 0]
    eos = ctx.tokenizer.token_id("<|endoftext|>")
    # one batch call: parallel in Rust when the tokenizer offers it
    enc = getattr(ctx.tokenizer, "encode_batch", None) or (lambda ts: [ctx.tokenizer.encode(t) for t in ts])
    ids = [x + [eos] for x in enc([d.text for d in docs])] if docs else []
    offsets = np.zeros(len(ids) + 1, dtype=np.int64)
    np.cumsum([len(x) for x in ids], out=offsets[1:])
    flat = np.fromiter((t for x in ids for t in x), dtype=np.uint32, count=int(offsets[-1]))
    write_atomic(ctx.path("tok", u, "bin"), flat.tobytes())
    save_npy(ctx.path("tok", u, "idx.npy"), offsets)
    ctx.path("tok", u, "done").write_text("ok")


def embed_unit(ctx: StageContext, u: int) -> None:
    """SemDeDup stage 1: embeddings of the unit's prose survivors (positions in sem_pos_{u}.npy, from the driver)."""
    from glmstack.data.semdedup import embed, hashed_embed, resolve_embedder
    from glmstack.data.semdedup_shards import save_rows

    start = time.perf_counter()
    pos = np.load(ctx.path("sem_pos", u, "npy"))
    docs = read_docs(ctx.path("kept", u, "jsonl.zst")) if len(pos) else []
    texts = [docs[p].text for p in pos.tolist()]
    if texts:
        X = embed(texts, ctx.cfg.semdedup)
    elif resolve_embedder(ctx.cfg.semdedup) == "minilm":
        X = np.zeros((0, 384), np.float32)
    else:
        X = hashed_embed([], ctx.cfg.semdedup.n_features)
    save_rows(ctx.work / f"emb_{u:05d}", X)
    stats = {"seconds": time.perf_counter() - start, "in": len(texts), "out": len(texts)}
    stats["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    write_atomic(ctx.path("emb", u, "json"), json.dumps(stats))
