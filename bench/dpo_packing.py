"""DPO micro-batches padded (one sequence a row) vs packed (`dpo.packing`): what a training step's forward + backward
costs on the same pairs, one process.

The pairs are a preference file's (default: the synthetic checkable set, rendered by the model folder's tokenizer)
and the model is a folder (default: a seeded random `tiny` GLM with a fresh tokenizer). Each round times, in
alternation so a shared machine's load hits both alike, the DPO loss's forward + backward on one micro-batch of B
pairs: padded at `--seq-len` (the reference, the layout without the flag) and packed into rows of each of
`--pack-len` (≥ the longest sequence). Median of the measured rounds, and each layout's first call in the fresh
process beside it (the padded layout runs first, so it also pays the process's first-use costs); the ratio is
padded / packed on the medians (> 1: packing is faster). The log-probs of the two layouts are checked equal first (1e-4), so the timing is of the same objective.

    python bench/dpo_packing.py                                       # random tiny model, synthetic pairs
    python bench/dpo_packing.py --model runs/speedrun/sft/model --pairs prefs/train.jsonl --seq-len 64
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def tiny_folder(tmp: Path) -> str:
    from tests.posttrain.base import make_base

    return str(make_base(tmp / "base"))


def step_seconds(model, batch: dict) -> float:
    from glmstack.posttrain.dpo.loss import dpo_loss
    from glmstack.posttrain.dpo.stage import pair_terms

    model.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    logps, _, counts, _ = pair_terms(model, batch)  # the batch carries (zero) reference log-probs
    (lc, lr), (nc, nr) = logps.chunk(2), counts.chunk(2)
    loss, _ = dpo_loss(lc, lr, lc.detach(), lr.detach(), nc, nr, beta=0.1)
    (loss + lc.mean() * 1e-3).backward()  # dpo_loss is 0-gradient at policy = reference: give backward work
    return time.perf_counter() - t0


def main(argv: list[str]) -> int:
    from glmstack.model import load_hf
    from glmstack.posttrain.dpo.data import DPOBatches, encoded_pairs
    from glmstack.tokenizer import Tokenizer

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="model folder (default: a random tiny GLM)")
    ap.add_argument("--pairs", help="preference JSONL (default: synthetic:checkable)")
    ap.add_argument("--batch", type=int, default=16, help="pairs per micro-batch")
    ap.add_argument("--seq-len", type=int, default=0, help="padded length (default: the longest sequence)")
    ap.add_argument("--pack-len", type=int, nargs="+", default=[128, 256], help="packed row lengths")
    ap.add_argument("--rounds", type=int, default=8)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.model or tiny_folder(Path(tmp))
        tok = Tokenizer.load(folder)
        entries = [args.pairs] if args.pairs else ["synthetic:checkable"]
        pairs = encoded_pairs(entries, Path(tmp), 400, 0, "train", tok, "glm-4.5")
        longest = max(max(len(p[0]), len(p[1])) for p in pairs)
        seq_len = args.seq_len or longest
        model = load_hf(folder, missing_mtp="drop")
        layouts = {f"padded@{seq_len}": (seq_len, False)} | {f"packed@{n}": (n, True) for n in args.pack_len}
        batches = {}
        for name, (n, packed) in layouts.items():
            data = DPOBatches(pairs, batch_size=args.batch, seq_len=n, pad_id=0, seed=0, shuffle=False)
            data.packing = packed
            batches[name] = data.batch_of(list(range(args.batch))) | {"ref_logps": torch.zeros(2 * args.batch)}
        from glmstack.posttrain.dpo.stage import pair_terms

        with torch.no_grad():
            ref = pair_terms(model, batches[f"padded@{seq_len}"])[0]
            for name, b in batches.items():
                torch.testing.assert_close(pair_terms(model, b)[0], ref, atol=1e-4, rtol=1e-5)
        times: dict[str, list[float]] = {k: [] for k in batches}
        first: dict[str, float] = {}
        for r in range(args.rounds + 2):
            for name, b in batches.items():
                t = step_seconds(model, b)
                if r == 0:
                    first[name] = t  # this layout's first call in the process (allocator, first-use overheads)
                if r >= 2:
                    times[name].append(t)
    base = statistics.median(times[f"padded@{seq_len}"])
    print(f"{len(pairs)} pairs, sequences {longest} tokens at most, {args.batch} pairs a micro-batch, "
          f"torch threads {torch.get_num_threads()}")  # fmt: skip
    print(
        "| layout | rows | tokens (with padding) | ms / micro-batch (median) | first call ms | padded / this (median) |"
    )
    print("|---|---|---|---|---|---|")
    for name, b in batches.items():
        ms = statistics.median(times[name]) * 1e3
        rows, cols = b["input_ids"].shape
        print(f"| {name} | {rows} | {rows * cols} | {ms:.1f} | {first[name] * 1e3:.1f} | {base * 1e3 / ms:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
