"""The optimizer step alone: glmstack's Muon and AdamW groups on `tiny-moe` (with its MTP layer), against torch's
default AdamW (the per-parameter loop a plain training loop uses) on the same parameters, in one process.

Every parameter gets a fixed random gradient; each round steps Muon, our AdamW group and the reference once, in
turn, so load on a shared machine hits all alike; medians of CPU time. Muon's step is the part of a training step
that Newton–Schulz costs. For a before/after, run this file against two checkouts alternately:

    python bench/optim_step.py                                   # 1 thread, 10 rounds
    for t in old new; do PYTHONPATH=/path/to/$t python bench/optim_step.py --json; done
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from glmstack.model import GLM, ModelConfig
from glmstack.optim import build_optimizer
from glmstack.train.config import OptimConfig


def run(args) -> dict:
    torch.set_num_threads(args.threads)
    model = GLM(ModelConfig.preset("tiny-moe")).init_weights(seed=0)
    g = torch.Generator().manual_seed(0)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=g)
    ours, _ = build_optimizer(model, OptimConfig())
    reference = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    steps = {"muon": ours.optimizers["muon"].step, "adamw": ours.optimizers["adamw"].step, "torch-adamw": reference.step}
    times = {k: [] for k in steps}
    for i in range(args.warmup + args.rounds):
        for name, step in steps.items():
            t0 = time.process_time()
            step()
            if i >= args.warmup:
                times[name].append(time.process_time() - t0)
    ms = {k: round(1e3 * statistics.median(v), 2) for k, v in times.items()}
    n_ours = sum(p.numel() for g in ours.optimizers["adamw"].param_groups for p in g["params"])
    n_ref = sum(p.numel() for p in model.parameters())
    return {"threads": torch.get_num_threads(), "ms_cpu": ms, "adamw_params": n_ours, "all_params": n_ref}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    r = run(args)
    if args.json:
        print(json.dumps(r))
        return 0
    ms = r["ms_cpu"]
    print(f"tiny-moe optimizer step, {r['threads']} thread(s), median CPU ms over {args.rounds} rounds")
    print(f"  Muon (hidden matrices, expert banks)      {ms['muon']:>8} ms")
    print(f"  our AdamW ({r['adamw_params']:,} params)         {ms['adamw']:>8} ms")
    print(f"  torch AdamW default, all {r['all_params']:,} params {ms['torch-adamw']:>8} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
