"""fp32 GEMM rate at the training shapes of `tiny-moe` (8 x 256 tokens): torch's default (MKL) vs glmstack.model.gemm
(oneDNN), for the forward (x @ W.T), input-gradient (dy @ W) and weight-gradient (dy.T @ x) products.

Why it matters: on AMD CPUs MKL runs AVX2 kernels even where the CPU has AVX-512, oneDNN runs AVX-512 ones, and
GEMMs are ~70% of a training step; this is where glmstack's CPU training speed over transformers comes from.

    python bench/gemm.py              # 1 thread
    python bench/gemm.py --threads 2
"""

from __future__ import annotations

import argparse
import time

import torch

from glmstack.model import gemm

# (rows M, in K, out N): LM head, attention q/o, dense MLP, one expert's block (512 rows), the expert down proj
SHAPES = [(2048, 256, 4096), (2048, 256, 256), (2048, 256, 768), (2048, 768, 256), (512, 256, 256), (512, 128, 256)]


def rate(fn, flop: float, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return flop / best / 1e9


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=20)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if not gemm.AVAILABLE:
        print("this torch has no oneDNN: glmstack uses torch's matmul")
        return 0
    print(f"GFLOP/s, {args.threads} thread(s), best of {args.repeats}: MKL (torch) / oneDNN (glmstack) = ratio")
    for M, K, N in SHAPES:
        x, w, dy = torch.randn(M, K), torch.randn(N, K), torch.randn(M, N)
        flop = 2 * M * K * N
        cells = []
        for name, ref, ours in [
            ("fwd", lambda: x @ w.t(), lambda: gemm.mm(x, w.t())),
            ("dx", lambda: dy @ w, lambda: gemm.mm(dy, w)),
            ("dW", lambda: dy.t() @ x, lambda: gemm.mm_tn(dy, x)),
        ]:
            a, b = rate(ref, flop, args.repeats), rate(ours, flop, args.repeats)
            cells.append(f"{name} {a:5.0f} / {b:5.0f} = {b / a:.2f}x")
        print(f"  {M:>5} x {K:>4} x {N:>4}:  " + "   ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
