"""Throughput of each data-pipeline stage (documents/s and MB/s) on the embedded corpus, in one process.

Each stage is timed alone over the same documents so the figures add up to the cost of a build; the full
`build_dataset` wall time is printed last for comparison. docs/data.md quotes the table.

    python bench/data_throughput.py --size-mb 2 [--minilm 200]
"""

from __future__ import annotations

import argparse
import tempfile
import time

from glmstack.data.corpus import CorpusConfig, corpus_docs


def timed(label: str, docs, fn, rows: list):
    t = time.perf_counter()
    out = fn(docs)
    dt = time.perf_counter() - t
    mb = sum(len(d.text.encode("utf-8", "replace")) for d in docs) / 1e6
    rows.append((label, len(docs), dt, len(docs) / dt, mb / dt))
    return out


def stages(docs, tok, rows, minilm: int):
    from glmstack.data.decontam import Decontaminator, default_eval_texts
    from glmstack.data.dedup import MinHashConfig, MinHasher, exact_hash
    from glmstack.data.filters import FilterConfig, FilterReport, apply_filters, build_filters
    from glmstack.data.fim import FIMConfig, fim_ids
    from glmstack.data.quality import QualityConfig, QualityModel
    from glmstack.data.semdedup import SemDedupConfig, semdedup_drops

    fcfg = FilterConfig()
    filters = build_filters(fcfg, Decontaminator(default_eval_texts()))
    import copy

    timed(
        "filters + decontamination",
        docs,
        lambda ds: [apply_filters(copy.copy(d), fcfg, filters, FilterReport()) for d in ds],
        rows,
    )
    timed("exact hash", docs, lambda ds: [exact_hash(d.text) for d in ds], rows)
    hasher = MinHasher(MinHashConfig())
    timed("MinHash signatures", docs, lambda ds: [hasher.signature(d.text) for d in ds], rows)
    prose = [d for d in docs if d.kind == "text"]
    model = QualityModel(QualityConfig())
    timed("quality: train", prose, lambda ds: model.fit([d.text for d in ds]), rows)
    timed("quality: score", prose, lambda ds: model.score([d.text for d in ds]), rows)
    timed("SemDeDup (hashed)", prose, lambda ds: semdedup_drops([d.text for d in ds], SemDedupConfig()), rows)
    if minilm:
        sub = prose[:minilm]
        timed(
            "SemDeDup (MiniLM)",
            sub,
            lambda ds: semdedup_drops([d.text for d in ds], SemDedupConfig(embedder="minilm")),
            rows,
        )
    timed("tokenize", docs, lambda ds: [tok.encode(d.text) for d in ds], rows)
    timed("tokenize (batch)", docs, lambda ds: tok.encode_batch([d.text for d in ds]), rows)
    code = [d for d in docs if d.kind == "code"]
    timed("FIM + tokenize (code)", code, lambda ds: [fim_ids(d.text, d.id, tok, FIMConfig(rate=1.0)) for d in ds], rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size-mb", type=float, default=2.0)
    p.add_argument("--minilm", type=int, default=0, help="also time MiniLM SemDeDup on this many documents")
    p.add_argument("--vocab-size", type=int, default=4096)
    args = p.parse_args(argv)
    from glmstack.tokenizer import Tokenizer

    rows: list = []
    cfg = CorpusConfig(size_mb=args.size_mb)
    docs = timed("read (build corpus)", [], lambda _: list(corpus_docs(cfg, "all")), [])
    docs = timed("read (build corpus)", docs, lambda _: list(corpus_docs(cfg, "all")), rows)
    tok = timed("tokenizer: train", docs, lambda ds: Tokenizer.train((d.text for d in ds), args.vocab_size), rows)
    stages(docs, tok, rows, args.minilm)
    from glmstack.data.pipeline import PipelineConfig, build_dataset

    with tempfile.TemporaryDirectory() as out:
        timed(
            "build_dataset (all stages)",
            docs,
            lambda _: build_dataset(PipelineConfig(corpus=cfg, progress=False), tok, out),
            rows,
        )
        from glmstack.data.loader import PackedLoader, PretrainLoader

        for cls in (PretrainLoader, PackedLoader):
            for fim in (False, None):  # None: the sampling-time FIM the build asks for (rate 0.5 on code)
                loader = cls(f"{out}/train", seq_len=1024, batch_size=8, fim=fim)
                it = iter(loader)
                t = time.perf_counter()
                n = min(len(loader), 50)
                for _ in range(n):
                    next(it)
                dt = time.perf_counter() - t
                label = f"{cls.__name__} {'+FIM' if fim is None else 'no FIM'} (B=8, T=1024)"
                rows.append((label, n, dt, n / dt, n * 8 * 1024 / dt / 1e6))
    print(f"{sum(len(d.text) for d in docs) / 1e6:.1f} MB, {len(docs)} documents")
    print(f"{'stage':<40}{'docs':>7}{'seconds':>9}{'docs/s':>10}{'MB/s':>8}")
    for label, n, dt, dps, mbs in rows:
        unit = "  (batches/s, Mtok/s)" if "Loader" in label else ""
        print(f"{label:<40}{n:>7}{dt:>9.2f}{dps:>10.1f}{mbs:>8.2f}{unit}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
