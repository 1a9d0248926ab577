"""Where a training step's CPU time goes, per aten op: glmstack's GLM or transformers' Glm4MoeForCausalLM.

Same models and batch as bench/model_throughput.py. Every aten call of a few steps is timed in process CPU time
(a TorchDispatchMode), so a loaded shared machine, where torch.profiler's wall times swell, still gives stable
figures. Prints the step's CPU time, the share in GEMMs (mm/addmm/bmm/_grouped_mm, their GFLOP/s) and in SDPA,
then the costliest ops.

    python bench/op_profile.py                     # glmstack, default allocator
    python bench/op_profile.py --side transformers --heap
"""

from __future__ import annotations

import argparse
import collections
import time

import torch
from model_throughput import build_models, keep_heap
from torch.utils._python_dispatch import TorchDispatchMode

GEMMS = ("mm", "addmm", "addmm_", "bmm", "_grouped_mm")


class CpuTimer(TorchDispatchMode):
    """Accumulates process CPU seconds per (op, input shapes)."""

    def __init__(self):
        super().__init__()
        self.seconds: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        t = time.process_time()
        out = func(*args, **(kwargs or {}))
        shapes = tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor))
        self.seconds[(func.overloadpacket.__name__, shapes)] += time.process_time() - t
        return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--side", choices=("glmstack", "transformers"), default="glmstack")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--heap", action="store_true", help="glibc: all allocations from the heap (no page-fault churn)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    if args.heap:
        keep_heap()
    ours, hf = build_models("tiny-moe", None)
    ids = torch.randint(0, ours.cfg.vocab_size, (8, 256), generator=torch.Generator().manual_seed(0))
    labels = torch.cat([ids[:, 1:], torch.full_like(ids[:, :1], -100)], 1)
    model = ours if args.side == "glmstack" else hf

    def step():
        model.zero_grad(set_to_none=True)
        out = model(ids, labels=labels) if args.side == "glmstack" else model(ids, labels=ids)
        (out.lm_loss if args.side == "glmstack" else out.loss).backward()

    step(), step()
    t = time.process_time()
    for _ in range(args.steps):
        step()
    plain = (time.process_time() - t) / args.steps
    timer = CpuTimer()
    with timer:
        for _ in range(args.steps):
            step()
    per_step = {k: v / args.steps for k, v in timer.seconds.items()}
    gemm = sum(v for (op, _), v in per_step.items() if op in GEMMS)
    sdpa = sum(v for (op, _), v in per_step.items() if "attention" in op)
    gflop = (ours.flops_per_token(256) - 6 * 4 * ours.cfg.num_attention_heads * ours.cfg.head_dim * 256) * 8 * 256 / 1e9
    print(f"{args.side}: step {plain * 1e3:.0f} ms CPU; in aten ops {sum(per_step.values()) * 1e3:.0f} ms: GEMMs "
          f"{gemm * 1e3:.0f} ms ({gflop:.1f} GFLOP, {gflop / gemm:.0f} GFLOP/s), SDPA {sdpa * 1e3:.0f} ms, other "
          f"{(sum(per_step.values()) - gemm - sdpa) * 1e3:.0f} ms")
    by_op = collections.Counter()
    for (op, _), v in per_step.items():
        by_op[op] += v
    print("by op (ms):", ", ".join(f"{op} {v * 1e3:.1f}" for op, v in by_op.most_common(args.top)))
    for (op, shapes), v in collections.Counter(per_step).most_common(args.top):
        print(f"  {v * 1e3:7.2f} ms  {op} {shapes}"[:140])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
