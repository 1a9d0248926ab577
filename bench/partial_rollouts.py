"""Rollout throughput with and without partial rollouts (rl.partial_rollouts, posttrain/rl/partial.py).

A rollout batch waits for its longest samples. This runs the RL data stream alone (no training: the weights stay
those of --model, the version still advances each step, so staleness is counted as in a run) for --steps steps of
--samples rollouts on a task with a long length tail, plain and with partial rollouts at each over-sampling factor,
interleaved step by step so machine load hits every arm alike, and prints per arm: finished samples per second of
rollout, the engine's idle fraction (row-steps decoded for rows already finished), decode steps, aborted and resumed
rows. Held-out accuracy is not measured here (the weights do not change): `glmstack rl` runs with and without
`rl.partial_rollouts` measure that (docs/rl.md).

    python bench/partial_rollouts.py --model runs/speedrun/sft/model
    python bench/partial_rollouts.py --model M --task arithmetic --temperature 1.5 --max-new-tokens 64 --oversample 0.25,0.5
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch

from glmstack.model.hf import load_hf
from glmstack.posttrain.rl.rollouts import Rollouts
from glmstack.posttrain.rl.stage import RLOptions
from glmstack.posttrain.rl.tasks import make_task
from glmstack.tokenizer import Tokenizer


def stream(model, tok, opts: RLOptions, seed: int) -> Rollouts:
    task = make_task(opts.task, tok, opts.chat_style, opts.thinking)
    return Rollouts(model=model, task=task, opts=opts, seed=seed, micro_batches=1, tokenizer=tok, style=opts.chat_style)


def mean(rows: list[dict], key: str) -> float:
    return sum(f.get(key, 0.0) for f in rows) / len(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--task", default="chat")
    ap.add_argument("--level", type=int, default=0)
    ap.add_argument("--temperature", type=float, default=1.3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--oversample", default="0.25,0.5,1.0")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    model, tok = load_hf(args.model, dtype=torch.float32).eval(), Tokenizer.load(args.model)
    base = RLOptions(task=args.task, samples_per_step=args.samples, curriculum=[[0, args.level, args.group]],
                     max_new_tokens=args.max_new_tokens, temperature=args.temperature, dynamic_sampling=False,
                     tau=1, eval_every=0, heldout_n=1)  # fmt: skip
    arms = {"plain": base} | {f"partial {x}": dataclasses.replace(base, partial_rollouts=True,
                                                                   partial_oversample=float(x))
                              for x in args.oversample.split(",")}  # fmt: skip
    streams = {name: stream(model, tok, o, args.seed) for name, o in arms.items()}
    figures: dict[str, list[dict]] = {name: [] for name in arms}
    for step in range(args.steps + 1):  # step 0 warms up (and fills the partial arms' pipelines)
        for name, ro in streams.items():
            t0 = time.perf_counter()
            stats = ro.make_step()[0]["stats"]
            if step:
                figures[name].append(stats | {"wall_s": time.perf_counter() - t0})
    print(f"{args.task} (level {args.level}), T={args.temperature}, {args.samples} samples of <= {args.max_new_tokens} "
          f"tokens per step, {args.steps} steps after one warm-up, {args.threads} thread(s)")  # fmt: skip
    print("| arm | samples/s (median) | idle frac | response len | aborted rows/step | resumed rows/step |")
    print("|---|---|---|---|---|---|")
    plain = statistics.median(f["rollout_samples_per_s"] for f in figures["plain"])
    for name, rows in figures.items():
        sps = statistics.median(f["rollout_samples_per_s"] for f in rows)
        idle, length, aborted, resumed = (mean(rows, k) for k in ("rollout_idle_frac", "response_len",
                                                                   "partial/aborted_rows", "partial/resumed_rows"))
        print(f"| {name} | {sps:.1f} (x{sps / plain:.2f}) | {idle:.3f} | {length:.1f} | {aborted:.1f} | {resumed:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
