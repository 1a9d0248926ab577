"""Asynchronous vs synchronous agentic RL: accepted trajectories per second of the same run on a local Ray
cluster (issue 18: async > sync on the same machine).

Both modes are the real stage (`run_agentic`, runner=ray, the one loop): `asynchronous=False` submits a batch's
tasks only after the trainer pushed its weights (generation and training alternate), `asynchronous=True` keeps
`inflight` tasks queued per worker so the workers generate while the trainer trains (staleness bound `--tau`).
The rate is the steps' trajectories over the loop's wall time after its first step (actor start-up excluded).
Modes alternate `--repeats` times in one process on one Ray cluster, so load on a shared machine hits both alike.

    python bench/agentic_async.py --model /path/to/sft/model --steps 5 --repeats 2 --num-cpus 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path


def run_once(model: str, out: str, asynchronous: bool, args) -> float:
    from glmstack.posttrain.agentic.stage import run_agentic
    from glmstack.recipes.agentic_speedrun import agentic

    cfg = agentic()
    cfg.init_from, cfg.out_dir, cfg.runner, cfg.steps = model, out, "ray", args.steps
    cfg.run = f"{'async' if asynchronous else 'sync'}"
    cfg.log.progress = cfg.log.plots = False
    cfg.ckpt.resume = "never"
    o = cfg.agentic
    o.envs, o.heldout_n, o.workers, o.inflight, o.tau, o.asynchronous = (
        [[args.env, 1.0]],
        0,
        2,
        2,
        args.tau,
        asynchronous,
    )
    run_agentic(cfg)
    rows = [json.loads(x) for x in (Path(out) / cfg.run / "agentic" / "metrics.jsonl").read_text().splitlines()]
    later = rows[1:]  # the first step pays the actors' start-up
    batch = o.group_size * o.groups_per_step
    seconds = sum(batch / r["traj_per_s"] for r in later)  # traj_per_s = a batch over its step-to-step time
    return sum(r["accepted_trajectories"] - p["accepted_trajectories"] for p, r in zip(rows, later)) / seconds


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="a chat model folder (the SFT'd speedrun model)")
    ap.add_argument("--env", default="python")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--tau", type=int, default=2)
    ap.add_argument("--num-cpus", type=int, default=2)
    args = ap.parse_args()
    import os

    import ray
    import torch

    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # the actors at the driver's priority: Ray's default lowers theirs (nice 19 under a nice-10 driver), which on a
    # shared machine starves them behind everyone else's work and measures the neighbours, not the runner
    os.environ.setdefault("RAY_worker_niceness", "0")
    print(
        f"local Ray cluster, num_cpus={args.num_cpus}; load average {os.getloadavg()[0]:.1f} at the start", flush=True
    )
    ray.init(num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)
    rates: dict[str, list[float]] = {"sync": [], "async": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for mode in ("sync", "async"):
                rate = run_once(args.model, f"{tmp}/{r}", mode == "async", args)
                rates[mode].append(rate)
                print(f"repeat {r} {mode:5s} {rate:.3f} trajectories/s", flush=True)
    ray.shutdown()
    s, a = statistics.median(rates["sync"]), statistics.median(rates["async"])
    print(
        f"median sync {s:.3f} traj/s, async {a:.3f} traj/s: async / sync = {a / s:.2f}x "
        f"(load average {os.getloadavg()[0]:.1f})"
    )


if __name__ == "__main__":
    main()
