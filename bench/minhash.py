"""MinHash near-duplicate detection: recall / false positives on planted near-duplicates, speed vs datasketch.

Base documents are Zipf-distributed random words (so no two are related); planted copies edit 1-20% of the
words of a base document (substitute / delete / insert). Ground truth is the exact word-5-gram Jaccard of each
planted pair. Both implementations use the same shingles and 100 permutations; datasketch's MinHashLSH picks
its own bands for threshold 0.7. Prints recall by Jaccard bin and by edit rate, the false-positive rate on the
base documents, and documents per second (signature + index) for each. "glmstack sharded" is the same MinHash
through dedup_shards' disk-based stages on 2 processes (decisions identical by construction; this shows it).
docs/data.md quotes the table.

    python bench/minhash.py --base 2000 --planted 1000            # FineWeb shingles (word 5-grams)
    python bench/minhash.py --base 2000 --planted 1000 --ngram 1  # word sets: 5-20% edits land at J 0.7-0.9
"""

from __future__ import annotations

import argparse
import random
import time

import numpy as np

from glmstack.data.dedup import WORD_RE, LSHIndex, MinHashConfig, MinHasher, jaccard


def make_docs(n_base: int, n_planted: int, seed: int):
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(20000)]
    weights = [1.0 / (i + 1) ** 1.1 for i in range(len(vocab))]
    base = [" ".join(rng.choices(vocab, weights, k=rng.randint(100, 600))) for _ in range(n_base)]
    planted, rates = [], []
    for i in range(n_planted):
        words, rate = base[i].split(), rng.uniform(0.01, 0.20)
        for k in sorted(rng.sample(range(len(words)), int(len(words) * rate)), reverse=True):
            op = rng.randrange(3)
            if op == 0:
                words[k] = rng.choice(vocab)
            elif op == 1:
                del words[k]
            else:
                words.insert(k, rng.choice(vocab))
        planted.append(" ".join(words))
        rates.append(rate)
    return base, planted, rates


def run_ours(texts: list[str], ngram: int) -> tuple[list[int], float]:
    cfg = MinHashConfig(ngram=ngram)
    hasher, index = MinHasher(cfg), LSHIndex(cfg)
    t = time.perf_counter()
    matches = [index.add(hasher.signature(x)) for x in texts]
    return matches, time.perf_counter() - t


def run_datasketch(texts: list[str], ngram: int, num_perm: int = 100) -> tuple[list[int], float]:
    from datasketch import MinHash, MinHashLSH

    lsh = MinHashLSH(threshold=0.7, num_perm=num_perm)
    t = time.perf_counter()
    matches = []
    for i, x in enumerate(texts):
        ws = WORD_RE.findall(x.lower())
        m = MinHash(num_perm=num_perm)
        m.update_batch([" ".join(ws[k : k + ngram]).encode() for k in range(max(1, len(ws) - ngram + 1))])
        hits = lsh.query(m)
        matches.append(min(hits) if hits else -1)
        lsh.insert(i, m)
    return matches, time.perf_counter() - t


def run_sharded(texts: list[str], ngram: int) -> tuple[list[int], float]:
    """dedup_shards' disk-based stages on 2 processes; a dropped document's partner is not recorded, so a drop
    counts as a match with its planted base (base documents are unrelated, so any drop of a copy is that one)."""
    import functools
    import tempfile
    from pathlib import Path

    from glmstack.data.dedup import exact_hash
    from glmstack.data.dedup_shards import make_plan, run_sharded_dedup, write_units
    from glmstack.data.executor import run_units

    cfg = MinHashConfig(ngram=ngram)
    hasher = MinHasher(cfg)
    t = time.perf_counter()
    sigs = np.stack([hasher.signature(x) for x in texts])
    hashes = np.array([list(exact_hash(x)) for x in texts], np.uint8)
    with tempfile.TemporaryDirectory() as d:
        counts = write_units(Path(d) / "in", sigs, hashes, unit_docs=500)
        plan = make_plan(Path(d) / "in", Path(d) / "work", counts, cfg, block_docs=1000, shard_records=20_000)
        run = functools.partial(run_units, executor="processes", workers=2, progress=False)
        result = run_sharded_dedup(plan, run)
    dropped = set(result["minhash"].tolist()) | set(result["exact"].tolist())
    n_base = len(texts) - len(PLANTED)
    matches = [(i - n_base if i >= n_base else 0) if i in dropped else -1 for i in range(len(texts))]
    return matches, time.perf_counter() - t


PLANTED: list[str] = []


def report(name: str, matches, n_base, base, planted, rates, jac, seconds):
    found = np.array([matches[n_base + i] == i for i in range(len(planted))])
    fp = np.mean([m >= 0 for m in matches[:n_base]])
    speed = f"{len(matches) / seconds:,.0f} docs/s ({seconds:.2f} s)"
    rows = [f"{name}: {speed}, false positives on base docs {fp:.2%}"]
    for lo, hi in ((0.8, 1.01), (0.7, 0.8), (0.5, 0.7), (0.0, 0.5)):
        sel = (jac >= lo) & (jac < hi)
        if sel.any():
            rows.append(
                f"  recall for Jaccard [{lo:.1f}, {min(hi, 1):.1f}): {found[sel].mean():.3f} ({sel.sum()} pairs)"
            )
    sel = rates >= 0.05
    rows.append(
        f"  recall for 5-20% edited words: {found[sel].mean():.3f} ({sel.sum()} pairs; "
        f"their Jaccard {jac[sel].min():.2f}-{jac[sel].max():.2f})"
    )
    return "\n".join(rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base", type=int, default=2000)
    p.add_argument("--planted", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ngram", type=int, default=5, help="words per shingle (5 = FineWeb; 1 = word sets)")
    args = p.parse_args(argv)
    base, planted, rates = make_docs(args.base, args.planted, args.seed)
    jac = np.array([jaccard(base[i], d, args.ngram) for i, d in enumerate(planted)])
    texts = base + planted
    PLANTED[:] = planted
    mb = sum(len(t) for t in texts) / 1e6
    print(f"{len(texts)} documents ({mb:.1f} MB): {args.base} base + {args.planted} planted (1-20% of words edited)")
    cfg = MinHashConfig(ngram=args.ngram)
    print(
        f"ours: word {cfg.ngram}-grams, {cfg.bands} bands x {cfg.rows} rows, confirm at estimated J >= {cfg.threshold}"
    )
    for name, fn in (("glmstack", run_ours), ("glmstack sharded", run_sharded), ("datasketch", run_datasketch)):
        matches, secs = fn(texts, args.ngram)
        print(report(name, matches, args.base, base, planted, np.array(rates), jac, secs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
