"""Where a training step's CPU time goes, per aten op: glmstack's GLM or transformers' Glm4MoeForCausalLM.

Same models and batch as bench/model_throughput.py. Every aten call of a few steps is timed in process CPU time
(a TorchDispatchMode), so a loaded shared machine, where torch.profiler's wall times swell, still gives stable
figures. Prints the step's CPU time, the share in GEMMs (mm/addmm/bmm/_grouped_mm, their GFLOP/s) and in SDPA,
then the costliest ops. With `--side both`, also the bound that settles issue 2's target: glmstack's GEMM + SDPA
time alone (the kernels whose FLOPs the model fixes) against transformers' whole step, i.e. the speedup glmstack
would reach if every other op, the autograd engine and Python cost nothing.

    python bench/op_profile.py                     # glmstack, default allocator, 1 thread
    python bench/op_profile.py --side both --threads 2
    python bench/op_profile.py --side transformers --heap

With more than one thread the clock is wall time (process CPU time would add up the threads); run it on a quiet
machine then.
"""

from __future__ import annotations

import argparse
import collections
import time

import torch
from model_throughput import build_models, keep_heap
from torch.utils._python_dispatch import TorchDispatchMode

GEMMS = ("mm", "addmm", "addmm_", "bmm", "_grouped_mm", "_linear_pointwise")  # the last: oneDNN (model/gemm.py)


class CpuTimer(TorchDispatchMode):
    """Accumulates seconds of `clock` per (op, input shapes)."""

    def __init__(self, clock=time.process_time):
        super().__init__()
        self.clock = clock
        self.seconds: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        t = self.clock()
        out = func(*args, **(kwargs or {}))
        shapes = tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor))
        self.seconds[(func.overloadpacket.__name__, shapes)] += self.clock() - t
        return out


def profile(side: str, model, ids, labels, steps: int, clock) -> tuple[float, dict]:
    """-> (seconds per plain step, {(op, shapes): seconds per step}) for one side."""

    def step():
        model.zero_grad(set_to_none=True)
        out = model(ids, labels=labels) if side == "glmstack" else model(ids, labels=ids)
        (out.lm_loss if side == "glmstack" else out.loss).backward()

    step(), step()
    t = clock()
    for _ in range(steps):
        step()
    plain = (clock() - t) / steps
    timer = CpuTimer(clock)
    with timer:
        for _ in range(steps):
            step()
    return plain, {k: v / steps for k, v in timer.seconds.items()}


def report(side: str, plain: float, per_step: dict, gflop: float, top: int) -> tuple[float, float]:
    """Prints one side's breakdown -> (GEMM seconds, SDPA seconds) per step."""
    gemm = sum(v for (op, _), v in per_step.items() if op in GEMMS)
    sdpa = sum(v for (op, _), v in per_step.items() if "attention" in op)
    print(f"{side}: step {plain * 1e3:.0f} ms; in aten ops {sum(per_step.values()) * 1e3:.0f} ms: GEMMs "
          f"{gemm * 1e3:.0f} ms ({gflop:.1f} GFLOP, {gflop / gemm:.0f} GFLOP/s), SDPA {sdpa * 1e3:.0f} ms, other "
          f"{(sum(per_step.values()) - gemm - sdpa) * 1e3:.0f} ms")
    by_op = collections.Counter()
    for (op, _), v in per_step.items():
        by_op[op] += v
    print("  by op (ms):", ", ".join(f"{op} {v * 1e3:.1f}" for op, v in by_op.most_common(top)))
    for (op, shapes), v in collections.Counter(per_step).most_common(top):
        print(f"  {v * 1e3:7.2f} ms  {op} {shapes}"[:140])
    return gemm, sdpa


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--side", choices=("glmstack", "transformers", "both"), default="glmstack")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--heap", action="store_true", help="glibc: all allocations from the heap (no page-fault churn)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    clock = time.process_time if args.threads == 1 else time.perf_counter
    if args.heap:
        keep_heap()
    ours, hf = build_models("tiny-moe", None)
    ids = torch.randint(0, ours.cfg.vocab_size, (8, 256), generator=torch.Generator().manual_seed(0))
    labels = torch.cat([ids[:, 1:], torch.full_like(ids[:, :1], -100)], 1)
    gflop = (ours.flops_per_token(256) - 6 * 4 * ours.cfg.num_attention_heads * ours.cfg.head_dim * 256) * 8 * 256 / 1e9
    sides = ("glmstack", "transformers") if args.side == "both" else (args.side,)
    plain, kernels = {}, {}
    for side in sides:
        plain[side], per_step = profile(side, ours if side == "glmstack" else hf, ids, labels, args.steps, clock)
        kernels[side] = sum(report(side, plain[side], per_step, gflop, args.top))
    if args.side == "both":
        print(f"bound: glmstack's GEMMs + SDPA alone take {kernels['glmstack'] * 1e3:.0f} ms; transformers' step "
              f"{plain['transformers'] * 1e3:.0f} ms -> even with every other op free, glmstack <= "
              f"{plain['transformers'] / kernels['glmstack']:.2f}x transformers (now "
              f"{plain['transformers'] / plain['glmstack']:.2f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
