"""Sharded exact + MinHash dedup at scale on synthetic signatures: peak memory per task and time vs corpus size.

Every size writes units of random 100-value MinHash signatures and 16-byte exact hashes (not text: the
signature stage is per document and already parallel), with planted duplicates inside each unit: 5% near-copies
(an earlier document's signature with 10 of 100 values changed, estimated J = 0.9) and 1% exact copies. Then
dedup_shards runs its three stages on the process executor and the bench prints, per size, each stage's wall
time, the largest peak RSS of any task, documents per second, and checks that exactly the planted copies were
dropped. Generating the inputs is not timed. `--in-memory-check N` also compares with dedup.dedup_decisions on
the first N documents (it holds ~5.5 KB per document, so keep N small).

    python bench/dedup_scale.py --docs 1000000 2000000 4000000 10000000 --workers 2 --dir /tmp/dedup_scale
"""

from __future__ import annotations

import argparse
import functools
import shutil
import time
from pathlib import Path

import numpy as np

from glmstack.data.dedup import MinHashConfig, dedup_decisions
from glmstack.data.dedup_shards import decisions_from, make_plan, run_sharded_dedup
from glmstack.data.executor import run_units

NEAR, EXACT = 0.05, 0.01  # planted shares of documents


def unit_arrays(u: int, n: int, seed: int, width: int) -> tuple[np.ndarray, np.ndarray, int, int]:
    """(sigs, hashes, near copies, exact copies) of unit u: copies take the place of later rows in the unit."""
    rng = np.random.default_rng([seed, u])
    sigs = rng.integers(0, 2**63, size=(n, width), dtype=np.uint64)
    hashes = rng.integers(0, 256, size=(n, 16), dtype=np.uint8)
    n_near, n_exact = int(n * NEAR), int(n * EXACT)
    rows = rng.permutation(np.arange(n // 2, n))[: n_near + n_exact]  # copies of documents in the first half
    near, exact = rows[:n_near], rows[n_near:]
    src = rng.integers(0, n // 2, size=len(rows))
    sigs[near] = sigs[src[:n_near]]
    cols = rng.permuted(np.tile(np.arange(width), (n_near, 1)), axis=1)[:, :10]
    sigs[near[:, None], cols] ^= np.uint64(1)
    hashes[exact] = hashes[src[n_near:]]
    return sigs, hashes, n_near, n_exact


def generate_unit(inputs: Path, unit_docs: int, seed: int, width: int, u: int) -> None:
    sigs, hashes, _, _ = unit_arrays(u, unit_docs, seed, width)
    np.save(inputs / f"sig_{u:05d}.npy", sigs)
    np.save(inputs / f"hash_{u:05d}.npy", hashes)
    np.save(inputs / f"rank_{u:05d}.npy", np.arange(u * unit_docs, (u + 1) * unit_docs, dtype=np.int64))
    (inputs / f"gen_{u:05d}.done").write_text("ok")


def run_size(n_docs: int, args, cfg: MinHashConfig) -> dict:
    root = Path(args.dir) / f"n{n_docs}"
    shutil.rmtree(root, ignore_errors=True)
    inputs, n_units = root / "in", n_docs // args.unit_docs
    inputs.mkdir(parents=True)
    width = cfg.bands * cfg.rows
    run = functools.partial(run_units, executor="processes", workers=args.workers, progress=not args.quiet)
    gen = functools.partial(generate_unit, inputs, args.unit_docs, args.seed, width)
    run(gen, list(range(n_units)), lambda u: inputs / f"gen_{u:05d}.done", desc="generate")
    plan = make_plan(inputs, root / "work", [args.unit_docs] * n_units, cfg, args.unit_docs, args.shard_records)
    start = time.perf_counter()
    result = run_sharded_dedup(plan, run)
    seconds = time.perf_counter() - start
    want_near, want_exact = n_units * int(args.unit_docs * NEAR), n_units * int(args.unit_docs * EXACT)
    ok = len(result["minhash"]) == want_near and len(result["exact"]) == want_exact
    if args.in_memory_check:
        ok &= _in_memory_agrees(plan, result, min(args.in_memory_check, n_docs), cfg)
    shutil.rmtree(root, ignore_errors=True)
    return {"docs": n_docs, "shards": plan.n_shards, "seconds": seconds, "ok": ok, "stages": result["stages"]}


def _in_memory_agrees(plan, result, n: int, cfg: MinHashConfig) -> bool:
    units = range(-(-n // len(np.load(plan.unit_file("rank", 0), mmap_mode="r"))))
    sigs = np.concatenate([np.load(plan.unit_file("sig", u)) for u in units])[:n]
    hashes = np.concatenate([np.load(plan.unit_file("hash", u)) for u in units])[:n]
    ref = dedup_decisions([h.tobytes() for h in hashes], list(sigs), cfg)
    return decisions_from(result, result["stages"]["keys"]["docs_in"])[:n] == ref


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--docs", type=int, nargs="+", default=[1_000_000, 2_000_000])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--unit-docs", type=int, default=100_000, help="documents per unit (= per keys task)")
    p.add_argument("--shard-records", type=int, default=1 << 21, help="LSH band records per shard task")
    p.add_argument("--dir", default="/tmp/dedup_scale")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--in-memory-check", type=int, default=0, help="also compare the first N docs with in-memory")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    cfg = MinHashConfig()
    print(
        "| documents | shards | keys s | exact s | minhash s | total s | docs/s | peak MB/task (max of stages) | ok |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for n in args.docs:
        r = run_size(n, args, cfg)
        st = r["stages"]
        peak = max(s["peak_mb_per_task"] for s in st.values())
        print(
            f"| {n:,} | {r['shards']} | {st['keys']['seconds']:.1f} | {st['exact']['seconds']:.1f} | "
            f"{st['minhash']['seconds']:.1f} | {r['seconds']:.1f} | {n / r['seconds']:,.0f} | {peak:.0f} | "
            f"{'yes' if r['ok'] else 'NO'} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
