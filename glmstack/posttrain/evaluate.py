"""Held-out evaluation of a chat model on the synthetic sets: format, thinking switch, tool calls, task scores.

What: `evaluate(engine, style, sets, n)` rolls out `n` held-out prompts per set (half thinking on, half off;
greedy) and returns per set:
  well_formed      assistant turns that end at a stop token with no markup left in reasoning/content
  thinking_on      turns with the switch on that carry reasoning;   thinking_off: turns with it off that carry none
  tool_call_valid  (tools) first replies with a tool call whose arguments validate against the tool's JSON schema
  score            the set's verifier (arithmetic: final answer right; tools: right tool + result in the answer,
                   the tools really run; chat: the expected fact/name in the reply)
`glmstack sft-eval CKPT [CKPT ...]` prints them as a table (one column per checkpoint) and can write JSON.

    glmstack sft-eval runs/speedrun/model runs/speedrun/sft/model --n 100 --out eval.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from glmstack.posttrain.multiturn import rollout, turn_checks
from glmstack.posttrain.synthetic import SETS, generate, prompt_of, verify
from glmstack.posttrain.tools import validate_call

METRICS = ("well_formed", "thinking_on", "thinking_off", "tool_call_valid", "score")


def items_of(records: list[dict]) -> list[dict]:
    return [{"messages": prompt_of(r), "tools": r["tools"], "enable_thinking": r["enable_thinking"],
             "meta": r["meta"]} for r in records]  # fmt: skip


def held_out(set_name: str, n: int, seed: int = 0) -> list[dict]:
    return items_of(generate(set_name, n, seed, "test"))


def score_trajectories(trajs) -> dict[str, float]:
    counts = {k: [0, 0] for k in METRICS}

    def add(key, ok):
        counts[key][0] += int(ok)
        counts[key][1] += 1

    for t in trajs:
        thinking = t.item.get("enable_thinking", True)
        for text, finish, msg in zip(t.texts, t.finish, t.replies):
            c = turn_checks(text, finish, msg, thinking)
            add("well_formed", c["well_formed"])
            add("thinking_on" if thinking else "thinking_off", c["thinking_obeyed"])
        meta = t.item["meta"]
        if meta["set"] == "tools":
            first = t.replies[0].get("tool_calls") if t.replies else None
            add("tool_call_valid", bool(first) and all(validate_call(c, t.item["tools"]) is None for c in first))
        add("score", verify(meta, t.final, t.tool_calls))
    return {k: (a / n if n else None) for k, (a, n) in counts.items()}


def evaluate(engine, style: str, sets=SETS, n: int = 50, seed: int = 0, max_new_tokens: int = 96) -> dict:
    out = {}
    for s in sets:
        trajs = rollout(engine, held_out(s, n, seed), style, max_new_tokens=max_new_tokens)
        out[s] = score_trajectories(trajs) | {"n": n}
    return out


def table(results: dict[str, dict], title: str = "") -> str:
    """Markdown table: rows = set/metric, columns = models."""
    names = list(results)
    lines = [f"| {title or 'set / metric'} | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    sets = list(next(iter(results.values())))
    for s in sets:
        for m in METRICS:
            vals = [results[name][s].get(m) for name in names]
            if all(v is None for v in vals):
                continue
            lines.append(f"| {s} {m} | " + " | ".join("-" if v is None else f"{v:.1%}" for v in vals) + " |")
    return "\n".join(lines)


def load_engine(folder: str):
    from glmstack.inference import Engine
    from glmstack.model import load_hf
    from glmstack.tokenizer import Tokenizer

    return Engine(load_hf(folder), Tokenizer.load(folder))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="glmstack sft-eval", description=__doc__.splitlines()[0])
    ap.add_argument("checkpoints", nargs="+", help="model folders (config.json, safetensors, tokenizer.json)")
    ap.add_argument("--n", type=int, default=50, help="held-out prompts per set")
    ap.add_argument("--sets", default=",".join(SETS))
    ap.add_argument("--style", default="glm-4.5")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--out", default=None, help="write the results as JSON")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    results = {}
    for ckpt in args.checkpoints:
        if not (Path(ckpt) / "config.json").exists():
            print(f"glmstack sft-eval: {ckpt}: not a model folder (no config.json)", file=sys.stderr)
            return 2
        results[ckpt] = evaluate(load_engine(ckpt), args.style, args.sets.split(","), args.n,
                                 max_new_tokens=args.max_new_tokens)  # fmt: skip
    print(table(results))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
