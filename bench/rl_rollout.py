"""RL rollout overhead: tokens/s of the RL stage's rollout (Rollouts.generate: the seeds, logprobs=True, reward
samples) vs a bare Engine.generate on the same batch (issue 17: the loop's rollouts reach >= 80% of it).

Same model (a checkpoint folder, default the speedrun model; random `tiny` weights with --tiny), same prompts
(arithmetic level 0 when the folder has a tokenizer, else the token task), same batch, same temperature and seeds;
runs alternate bare / RL so load on a shared machine hits both alike; medians of wall time and of process CPU time.

    python bench/rl_rollout.py --model runs/speedrun/model --batch 64 --new 12 --repeats 7
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="runs/speedrun/model")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--new", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    torch.set_num_threads(1)
    from glmstack.model import load_hf
    from glmstack.posttrain.rl.rollouts import Rollouts
    from glmstack.posttrain.rl.stage import RLOptions
    from glmstack.posttrain.rl.tasks import make_task
    from glmstack.tokenizer import Tokenizer

    model, tok = load_hf(args.model), Tokenizer.load(args.model)
    group = 8
    opts = RLOptions(task="arithmetic", samples_per_step=args.batch, max_new_tokens=args.new, heldout_n=1)
    ro = Rollouts(model=model, task=make_task("arithmetic", tok), opts=opts, seed=0, micro_batches=1, tokenizer=tok)
    ro.sync()
    problems = ro.task.problems(split="train", n=args.batch // group, seed=0)
    prompts = [p.prompt_ids for p in problems for _ in range(group)]
    seeds = list(range(len(prompts)))
    times = {"bare": [], "rl": []}
    cpu = {"bare": [], "rl": []}
    tokens = {}
    for r in range(args.repeats + 1):
        for name in ("bare", "rl"):
            t0, c0 = time.perf_counter(), time.process_time()
            if name == "bare":
                res = ro.engine.generate(prompts, max_new_tokens=args.new, temperature=1.0, seeds=seeds)
                n = sum(map(len, res.tokens))
            else:
                rows, _ = ro.generate(problems, group, 1.0, ("bench", 0))
                n = sum(len(x[1]) for x in rows)
            if r:  # the first round warms up
                times[name].append(time.perf_counter() - t0)
                cpu[name].append(time.process_time() - c0)
                tokens[name] = n
    for name, wall in times.items():
        t, c = statistics.median(wall), statistics.median(cpu[name])
        print(
            f"{name:5s} {tokens[name] / t:8.0f} tok/s wall  {tokens[name] / c:8.0f} tok/s CPU  ({tokens[name]} tokens)"
        )
    ratio = (tokens["rl"] / statistics.median(times["rl"])) / (tokens["bare"] / statistics.median(times["bare"]))
    ratio_cpu = (tokens["rl"] / statistics.median(cpu["rl"])) / (tokens["bare"] / statistics.median(cpu["bare"]))
    print(f"RL rollout / bare Engine.generate: {ratio:.2f} (wall), {ratio_cpu:.2f} (CPU)")


if __name__ == "__main__":
    main()
