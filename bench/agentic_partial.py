"""Partial rollouts for agentic RL on a long tail of episode times: trajectories per second, the workers' idle
fraction and held-out success, with and without `agentic.partial_rollouts` (issue 41).

The long tail is the tools' latency (`agentic.env.tool_latency_s`: every calculator call waits a log-normal time,
median M, shape 1 — the 99th percentile ~10 × M), as remote tools (search APIs, sandboxes) have. Each arm is the
real stage (`run_agentic`, recipe `agentic_calc`, runner=ray, 2 rollout actors) training from the same model:

    sync      the synchronous baseline: a step's groups are submitted after the push, the batch waits for its
              slowest group (workers idle meanwhile)
    partial   agentic.partial_rollouts with over-sampling o: ceil(n × (1 + o)) groups outstanding, the first n to
              finish train, the rest run on over the push (later turns on newer weights, versions recorded) and
              train at a later step within tau (APRIL's over-sampling; nothing aborted)
    async     / async_partial: the asynchronous runner (workers × inflight queued), in order / out of order

Rate = accepted trajectories over the loop's wall time after its first step (actor start-up and the first
held-out evaluation excluded); idle = 1 − the actors' time inside rollouts / (actors × that wall time). Arms
alternate per seed in one process on one Ray cluster, so load on a shared machine hits them alike.

    python bench/agentic_partial.py --model runs/speedrun/sft/model --seeds 0 1 2 --latency 0.1
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

ARMS = {"sync": (False, False), "partial": (False, True), "async": (True, False), "async_partial": (True, True)}


def run_arm(arm: str, seed: int, out: str, args) -> dict:
    from glmstack.posttrain.agentic.stage import run_agentic
    from glmstack.recipes.agentic_calc import agentic

    cfg = agentic()
    cfg.init_from, cfg.out_dir, cfg.runner, cfg.seed, cfg.run = args.model, out, "ray", seed, f"{arm}_s{seed}"
    cfg.steps, cfg.optim.lr = args.steps, args.lr or cfg.optim.lr
    cfg.log.progress = cfg.log.plots = False
    cfg.ckpt.resume = "never"
    o = cfg.agentic
    o.asynchronous, o.partial_rollouts = ARMS[arm]
    o.workers, o.inflight, o.tau, o.partial_oversample = 2, args.inflight, args.tau, args.oversample
    o.env.tool_latency_s, o.env.tool_latency_sigma = args.latency, args.sigma
    o.heldout_n, o.eval_every, o.level = args.heldout, args.steps, args.level
    summary = run_agentic(cfg)
    rows = [json.loads(x) for x in (Path(out) / cfg.run / "agentic" / "metrics.jsonl").read_text().splitlines()]
    first, last = rows[0], rows[-1]
    batch = o.group_size * o.groups_per_step
    seconds = sum(batch / r["traj_per_s"] for r in rows[1:])  # traj_per_s = a batch over its step-to-step time
    busy = last["rollout/worker_busy_s"] - first["rollout/worker_busy_s"]
    return {
        "arm": arm, "seed": seed,
        "traj_per_s": (last["accepted_trajectories"] - first["accepted_trajectories"]) / seconds,
        "worker_idle_frac": 1 - busy / (o.workers * seconds),
        "heldout_start": first["heldout_success"], "heldout_end": summary["heldout_success"],
        "staleness_mean": statistics.mean(r["staleness_mean"] for r in rows),
        "stale_dropped": sum(r.get("rollout/stale", 0.0) for r in rows),
        "wall_s": seconds,
    }  # fmt: skip


def table(results: list[dict], arms: list[str]) -> str:
    def ms(xs: list[float], fmt: str) -> str:
        return f"{statistics.mean(xs):{fmt}} ± {statistics.stdev(xs):{fmt}}" if len(xs) > 1 else f"{xs[0]:{fmt}}"

    lines = [
        "| arm | held-out start → end | trajectories/s | workers idle | staleness (steps, mean) | stale groups dropped |",
        "|---|---|---|---|---|---|",
    ]
    for arm in arms:
        col = {k: [r[k] for r in results if r["arm"] == arm] for k in results[0] if k not in ("arm", "seed")}
        lines.append(
            f"| {arm} | {ms(col['heldout_start'], '.3f')} → {ms(col['heldout_end'], '.3f')} | "
            f"{ms(col['traj_per_s'], '.2f')} | {ms(col['worker_idle_frac'], '.2f')} | "
            f"{ms(col['staleness_mean'], '.2f')} | {ms(col['stale_dropped'], '.1f')} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="a chat model folder that calls the calculator (a speedrun SFT)")
    ap.add_argument("--arms", default="sync,partial", help=f"comma-separated, of {','.join(ARMS)}")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--level", type=int, default=1, help="the calculator's task level (agentic_calc: 1)")
    ap.add_argument("--lr", type=float, default=0.0, help="the learning rate (0: agentic_calc's, 1e-3)")
    ap.add_argument("--latency", type=float, default=0.1, help="median seconds of a tool call (log-normal)")
    ap.add_argument("--sigma", type=float, default=1.0, help="the log-normal's shape")
    ap.add_argument("--oversample", type=float, default=0.5)
    ap.add_argument("--tau", type=int, default=1)
    ap.add_argument("--inflight", type=int, default=1, help="tasks queued per worker (the async arms)")
    ap.add_argument("--heldout", type=int, default=128)
    ap.add_argument("--num-cpus", type=int, default=2)
    ap.add_argument("--json", default="", help="write the per-run results here")
    args = ap.parse_args()
    import os

    import ray
    import torch

    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("RAY_worker_niceness", "0")  # the actors at the driver's priority (bench/agentic_async.py)
    arms = args.arms.split(",")
    print(
        f"local Ray cluster, num_cpus={args.num_cpus}; load average {os.getloadavg()[0]:.1f} at the start", flush=True
    )
    ray.init(num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            for arm in arms:
                results.append(run_arm(arm, seed, tmp, args))
                print(json.dumps(results[-1]), flush=True)
    ray.shutdown()
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    print(table(results, arms))
    base = statistics.mean(r["traj_per_s"] for r in results if r["arm"] == arms[0])
    for arm in arms[1:]:
        rate = statistics.mean(r["traj_per_s"] for r in results if r["arm"] == arm)
        print(f"{arm} / {arms[0]}: x{rate / base:.2f} trajectories/s (mean over seeds)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
