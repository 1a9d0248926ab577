"""An agent conversation with context management against `glmstack serve` (issue 40): the client keeps the view
(posttrain/agentic/context.py, keep-last-1: every tool result but the latest stubbed) and sends its token ids each
turn with the official openai client; after a fold the server's prefix cache still serves the unchanged prefix
(`usage.prompt_tokens_details.cached_tokens`), and every reply equals no-cache greedy `Engine.generate` on the same
ids. The stress harness with folded prompts (tests/serve_stress.py `fold_frac`) reports no mismatches."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("openai")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from serve_fixture import RunningServer
from serve_stress import build_random_checkpoint, stress

from glmstack.chat import render
from glmstack.posttrain.agentic.context import Context, ContextOptions

pytestmark = pytest.mark.slow
BLOCK = 16
TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look a word up.", "parameters": {
    "type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}]  # fmt: skip


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return build_random_checkpoint(tmp_path_factory.mktemp("ctx") / "tiny")


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_prefix_cache_hits_the_unchanged_prefix_after_a_fold(ckpt):
    import openai

    srv = RunningServer(ckpt, prefix_cache_mb=64, prefix_block=BLOCK)
    try:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=120)
        tok = srv.engine.tokenizer
        user = [{"role": "user", "content": "the quick brown fox"}]
        view = Context(tok, tok.encode(render(user, TOOLS, add_generation_prompt=True)),
                       ContextOptions(keep_last_tool_results=1))  # fmt: skip
        seen, folded_turns = [], 0
        for turn in range(6):
            fold = view.manage(turn)
            ids = view.ids
            r = client.completions.create(model="tiny", prompt=ids, max_tokens=6, temperature=0,
                                          extra_body={"return_token_ids": True, "ignore_eos": True})  # fmt: skip
            got = r.choices[0].model_extra["token_ids"]
            cached = r.usage.prompt_tokens_details.cached_tokens
            with torch.inference_mode():
                assert got == srv.engine.generate([ids], 6, temperature=0, stop_ids=[]).tokens[0]  # no mismatch
            if seen:  # the server holds the last prompt + its completion: the shared prefix, block by block
                common = common_prefix(ids, seen)
                assert (common // BLOCK - 1) * BLOCK <= cached <= common and cached > 0, (turn, common, cached)
                folded_turns += fold is not None and common < len(seen)
            seen = ids + got
            view.add_model(got)
            view.add_env([{"role": "tool", "content": "the lazy dog jumps over the brown fox. " * 3}], after=got[-1])
        assert folded_turns == 4  # folds before turns 2..5, each sent after a changed prefix
    finally:
        srv.stop()


def test_stress_with_folded_prompts_has_no_mismatches(ckpt):
    res = stress(ckpt, n=48, concurrency=12, budget_mb=0.25, time_limit=300, fold_frac=0.4)
    assert res["errors"] == 0 and res["mismatches"] == 0, res
    assert res["prefill_computed"] < res["prompt_tokens"], res  # folded prompts still hit their prefixes
