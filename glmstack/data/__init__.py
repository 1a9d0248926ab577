"""Data pipeline: raw documents -> filtered, deduplicated, quality-bucketed, tokenised uint32 shards -> batches.

    from glmstack.data import PipelineConfig, build_dataset, PretrainLoader, PackedLoader
    summary = build_dataset(PipelineConfig(), tokenizer, "runs/data")      # or: glmstack data default --out runs/data
    loader = PretrainLoader("runs/data/train", seq_len=256, batch_size=8, rank=0, world_size=1)

Modules: sources (readers), filters/decontam (heuristics), quality + mixture (buckets -> epochs), dedup (exact +
MinHash LSH), semdedup, dedup_shards + semdedup_shards (the same decisions as sharded disk-based stages), fim, repo, corpus (default offline corpus), pipeline (the build), shards (token files),
packing + loader (batches), cli. Imports are lazy so `import glmstack.data` stays cheap.
"""

from __future__ import annotations

_EXPORTS = {
    "PipelineConfig": "glmstack.data.pipeline",
    "build_dataset": "glmstack.data.pipeline",
    "PretrainLoader": "glmstack.data.loader",
    "PackedLoader": "glmstack.data.loader",
    "CorpusConfig": "glmstack.data.corpus",
    "corpus_docs": "glmstack.data.corpus",
    "format_fim": "glmstack.data.fim",
    "parse_fim": "glmstack.data.fim",
}


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'glmstack.data' has no attribute {name!r}")
