"""Training throughput (forward + backward tokens/s) of glmstack's GLM vs transformers' Glm4MoeForCausalLM.

Both run the same weights (transformers saves, glmstack loads) on the `tiny-moe` preset (hidden 256, 4 layers,
16 experts top-4; no MTP layer, which transformers' main model lacks) at batch 8 x 256, in one process. Steps
alternate glmstack / transformers so that load on a shared machine hits both alike; the reported ratio is the
median of the per-pair ratios. Each step is timed twice: wall clock and the process's CPU time. On a busy shared
machine CPU time is the robust figure (a descheduled process accrues none), which is also why the default is one
thread (with several, a descheduled worker stalls the others at every barrier). Each side's GFLOP/s
(model.flops_per_token) is set against the fp32 matmul peak measured at start with the same threads.

The loss is each side's own training loss on the same shifted targets (glmstack `lm_loss`, transformers `loss`
from `labels=input_ids`), fp32, MTP off on both. Each step's minor page faults are counted too: with glibc's
default allocator every tensor over the mmap threshold is fresh pages, faulted in at first touch; `--heap` keeps
all allocations on the heap (mallopt, for both sides alike, as jemalloc/tcmalloc would) to show the ratio without
that cost.

    python bench/model_throughput.py                    # defaults: 8 x 256, 15 pairs after 3 warm-up pairs
    python bench/model_throughput.py --heap             # both sides without page-fault churn
    python bench/model_throughput.py --hf-experts eager # transformers' per-expert loop instead of its default
"""

from __future__ import annotations

import argparse
import ctypes
import json
import resource
import statistics
import tempfile
import time

import torch


def matmul_peak_gflops(n: int = 1024, repeats: int = 10) -> float:
    """Best fp32 GEMM rate (CPU time) over a few tries, of torch.mm (MKL) and oneDNN (what glmstack's GEMMs use
    on CPU, glmstack/model/gemm.py; on AMD CPUs it runs AVX-512 where MKL runs AVX2): the ceiling any model step
    can approach here."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    kernels = [lambda: a @ b]
    if torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        kernels.append(lambda: torch.ops.mkldnn._linear_pointwise(a, b, None, "none", [], ""))
    best = float("inf")
    for kernel in kernels:
        for _ in range(repeats):
            t = time.process_time()
            kernel()
            best = min(best, (time.process_time() - t) / torch.get_num_threads())
    return 2 * n**3 / best / 1e9


def build_models(preset: str, hf_experts: str | None):
    from transformers import Glm4MoeConfig, Glm4MoeForCausalLM

    from glmstack.model import ModelConfig, load_hf

    cfg = ModelConfig.preset(preset, num_nextn_predict_layers=0)
    torch.manual_seed(0)
    hf = Glm4MoeForCausalLM(Glm4MoeConfig(**cfg.to_hf()))
    with tempfile.TemporaryDirectory() as tmp:
        hf.save_pretrained(tmp)
        ours = load_hf(tmp, dtype=torch.float32)
        kwargs = {"experts_implementation": hf_experts} if hf_experts else {}
        hf = Glm4MoeForCausalLM.from_pretrained(tmp, dtype=torch.float32, **kwargs)
    return ours.train(), hf.train()


def keep_heap() -> bool:
    """glibc: serve every allocation from the heap and never trim it (M_MMAP_THRESHOLD = -3, M_TRIM_THRESHOLD = -1),
    so each step's large tensors reuse pages instead of mmap'ing and faulting in fresh ones. False if not glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    return bool(libc.mallopt(-3, 1 << 30)) and bool(libc.mallopt(-1, 1 << 30))


def timed(fn) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds per thread, minor page faults) of one call."""
    w, c, f = time.perf_counter(), time.process_time(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    fn()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f
    return time.perf_counter() - w, (time.process_time() - c) / torch.get_num_threads(), faults


def step_ours(model, ids, labels_shifted):
    model.zero_grad(set_to_none=True)
    return timed(lambda: model(ids, labels=labels_shifted).lm_loss.backward())


def step_hf(model, ids, labels_shifted):
    model.zero_grad(set_to_none=True)
    return timed(lambda: model(ids, labels=ids).loss.backward())


def run(args) -> dict:
    torch.set_num_threads(args.threads)
    heap = keep_heap() if args.heap else False
    peak = matmul_peak_gflops()
    ours, hf = build_models(args.preset, args.hf_experts)
    B, T = args.batch, args.seq
    ids = torch.randint(0, ours.cfg.vocab_size, (B, T), generator=torch.Generator().manual_seed(0))
    labels = torch.cat([ids[:, 1:], torch.full_like(ids[:, :1], -100)], 1)
    times = {"glmstack": [], "transformers": []}  # (wall, cpu) per measured step
    for i in range(args.warmup + args.repeats):
        a, b = step_ours(ours, ids, labels), step_hf(hf, ids, labels)
        if i >= args.warmup:
            times["glmstack"].append(a)
            times["transformers"].append(b)
    flops = ours.flops_per_token(T) * B * T
    result = {"preset": args.preset, "batch": B, "seq": T, "threads": torch.get_num_threads(),
              "hf_experts": hf.config._experts_implementation, "matmul_peak_gflops": round(peak, 1),
              "allocator": "glibc heap only" if heap else "default"}
    for j, clock in enumerate(("wall", "cpu")):  # timed() order
        pairs = zip(times["glmstack"], times["transformers"])
        result[f"speedup_{clock}"] = round(statistics.median(b[j] / a[j] for a, b in pairs), 3)
    for side, ts in times.items():
        cpu, wall = statistics.median(t[1] for t in ts), statistics.median(t[0] for t in ts)
        result[side] = {"cpu_s": round(cpu, 4), "wall_s": round(wall, 4), "tokens_per_cpu_s": round(B * T / cpu),
                        "gflops": round(flops / cpu / 1e9, 1), "pct_of_peak": round(100 * flops / cpu / 1e9 / peak, 1),
                        "page_faults": int(statistics.median(t[2] for t in ts))}
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="tiny-moe")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--repeats", type=int, default=15, help="measured glmstack/transformers step pairs")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--hf-experts", default=None, help="transformers experts_implementation (default: its own)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1 = robust on a shared machine)")
    p.add_argument("--heap", action="store_true", help="glibc: all allocations from the heap (no page-fault churn)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = p.parse_args(argv)
    r = run(args)
    if args.json:
        print(json.dumps(r))
        return 0
    print(f"{r['preset']} batch {r['batch']}x{r['seq']}, {r['threads']} thread(s), fp32 matmul peak "
          f"{r['matmul_peak_gflops']} GFLOP/s, transformers experts={r['hf_experts']}, allocator {r['allocator']}")
    for side in ("glmstack", "transformers"):
        s = r[side]
        print(f"  {side:<13} {s['tokens_per_cpu_s']:>7} tok/s  {s['cpu_s']:.3f} s/step CPU ({s['wall_s']:.3f} wall)"
              f"  {s['gflops']:>6} GFLOP/s ({s['pct_of_peak']}% of peak)  {s['page_faults']} page faults/step")
    print(f"  speedup glmstack / transformers, median of {args.repeats} interleaved pairs: "
          f"{r['speedup_cpu']}x CPU time, {r['speedup_wall']}x wall")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
