"""A 20-turn agent conversation against `glmstack serve` with context management on and off (issue 40): per turn the
prompt length, the prefill tokens the server computed (prompt − prefix-cache hits) and the time to first token.

    python bench/agent_context.py --turns 20 --keep-last 2          # a random tiny GLM, prefix cache on
    python bench/agent_context.py --model runs/long/sft_search/model --turns 20 --budget 400 --action discard

The client keeps the view (glmstack.posttrain.agentic.context: keep-last-k tool results or a token budget) and sends
its token ids each turn through the official openai client (streaming, greedy, `ignore_eos`); tool results are a
fixed text of ~`--tool-tokens` tokens. Without management the prompt grows by a reply and a tool result every turn
and the prefix cache computes only the new part; with it the prompt stays bounded, but a fold invalidates the cache
from the first changed token, so that turn recomputes the rest of the view. One server per arm, the same weights.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look a word up.", "parameters": {
    "type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}]  # fmt: skip


def conversation(ckpt: str, opts, turns: int, reply_tokens: int, tool_text: str) -> list[dict]:
    """One arm: a fresh server with a prefix cache; -> a row per turn."""
    import openai
    from serve_fixture import RunningServer

    from glmstack.chat import render
    from glmstack.posttrain.agentic.context import Context

    srv = RunningServer(ckpt, prefix_cache_mb=256, prefix_block=16)
    rows = []
    try:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=600)
        tok = srv.engine.tokenizer
        user = [{"role": "user", "content": "Find the secret code. Start with the note of Ana."}]
        view = Context(tok, tok.encode(render(user, TOOLS, add_generation_prompt=True)), opts)
        for turn in range(turns):
            fold = view.manage(turn)
            ids, before = view.ids, srv.sched.stats["prefill_computed"]
            t0, first, got = time.perf_counter(), None, []
            stream = client.completions.create(model="tiny", prompt=ids, max_tokens=reply_tokens, temperature=0,
                                               stream=True, extra_body={"return_token_ids": True, "ignore_eos": True})  # fmt: skip
            for chunk in stream:
                for c in chunk.choices:
                    new = (c.model_extra or {}).get("token_ids") or []
                    if new and first is None:
                        first = time.perf_counter() - t0
                    got += new
            rows.append({"turn": turn + 1, "prompt": len(ids), "prefill": srv.sched.stats["prefill_computed"] - before,
                         "ttft_ms": round(1000 * first, 1), "fold": fold is not None})  # fmt: skip
            view.add_model(got)
            view.add_env([{"role": "tool", "content": tool_text}], after=got[-1])
    finally:
        srv.stop()
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="", help="a model folder; default: a random tiny GLM (4096 positions)")
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument("--reply-tokens", type=int, default=16)
    ap.add_argument("--tool-tokens", type=int, default=60, help="about this many tokens per tool result")
    ap.add_argument("--keep-last", type=int, default=2)
    ap.add_argument("--budget", type=int, default=0)
    ap.add_argument("--action", default="stub", choices=("stub", "discard"))
    ap.add_argument("--json", default="", help="also write the rows here")
    a = ap.parse_args(argv)
    import torch

    from glmstack.posttrain.agentic.context import ContextOptions

    torch.set_num_threads(1)
    ckpt = a.model
    if not ckpt:
        from serve_stress import build_random_checkpoint

        ckpt = build_random_checkpoint(Path(tempfile.mkdtemp()) / "tiny", max_position_embeddings=4096)
    from glmstack.tokenizer import Tokenizer

    tok = Tokenizer.load(ckpt)
    unit = "the lazy dog jumps over the brown fox. "
    tool_text = unit * max(1, round(a.tool_tokens / max(1, len(tok.encode(unit)))))
    on = ContextOptions(keep_last_tool_results=a.keep_last, token_budget=a.budget, budget_action=a.action)
    arms = {"off": conversation(ckpt, ContextOptions(), a.turns, a.reply_tokens, tool_text),
            "on": conversation(ckpt, on, a.turns, a.reply_tokens, tool_text)}  # fmt: skip
    print(
        f"context management: {json.dumps(vars(on))}; tool result {len(tok.encode(tool_text))} tokens, "
        f"reply {a.reply_tokens}"
    )
    print(
        f"{'turn':>4} | {'off: prompt':>11} {'prefill':>7} {'ttft ms':>7} | {'on: prompt':>10} {'prefill':>7} "
        f"{'ttft ms':>7} fold"
    )
    for off, onr in zip(arms["off"], arms["on"]):
        print(
            f"{off['turn']:>4} | {off['prompt']:>11} {off['prefill']:>7} {off['ttft_ms']:>7} | {onr['prompt']:>10} "
            f"{onr['prefill']:>7} {onr['ttft_ms']:>7} {'yes' if onr['fold'] else ''}"
        )
    tot = {k: (sum(r["prompt"] for r in v), sum(r["prefill"] for r in v), sum(r["ttft_ms"] for r in v))
           for k, v in arms.items()}  # fmt: skip
    for k, (p, f, t) in tot.items():
        print(f"total {k}: prompt tokens {p}, prefill computed {f} ({f / p:.0%}), ttft {t:.0f} ms")
    if a.json:
        Path(a.json).write_text(json.dumps(arms, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
