"""Does the model *produce* the preferred behaviour? Greedy replies to held-out checkable preference prompts, scored
against the chosen answer (issue 39: DPO should raise "the preferred behaviour's rate", not only the likelihood
ratio its loss moves).

The synthetic checkable sets (glmstack.posttrain.rm.data) have a verifiable preferred reply: `sort` (the numbers in
order), `json` (a well-formed tool call with the right name and arguments), `arith` (the right sum). A reply shows
the preferred behaviour when it equals the chosen reply: the same text after trimming, or for `json` the same JSON
value (so spacing may differ but a broken or different call does not pass).

With `--task` the preferred behaviour is an RL task's own (the pairs `glmstack dpo pairs` makes from a model's
samples prefer right answers): greedy held-out accuracy under the task's verifier, on the held-out problems
`glmstack rl` evaluates with the same seed.

    glmstack dpo eval runs/speedrun/sft/model runs/speedrun/dpo/model --n 200     # a markdown table, one row each
    glmstack dpo eval runs/speedrun/sft/model runs/prefs_dpo/model --task compare --level 3
"""

from __future__ import annotations

import json
import sys


def prefers(kind: str, reply: str, chosen: str) -> bool:
    """Whether `reply` shows the preferred behaviour of a `kind` pair whose preferred reply is `chosen`."""
    reply, chosen = reply.strip(), chosen.strip()
    if kind == "json":
        try:
            return json.loads(reply) == json.loads(chosen)
        except ValueError:
            return False
    return reply == chosen


def preferred_rate(folder: str, n: int = 200, seed: int = 0, style: str = "glm-4.5",
                   max_new_tokens: int = 48) -> dict[str, float]:  # fmt: skip
    """Greedy replies of the model folder to `n` held-out checkable prompts -> {"all": rate, <kind>: rate}."""
    from glmstack.chat import parse, render
    from glmstack.inference import Engine
    from glmstack.model import load_hf
    from glmstack.posttrain.rm.data import synthetic_pairs
    from glmstack.tokenizer import Tokenizer

    tok = Tokenizer.load(folder)
    engine = Engine(load_hf(folder, missing_mtp="drop"), tok)
    items = synthetic_pairs("checkable", n, seed, "test")
    prompts = [render([{"role": "user", "content": it["prompt"]}], None, style=style, enable_thinking=False,
                      add_generation_prompt=True) for it in items]  # fmt: skip
    res = engine.generate(prompts, max_new_tokens=max_new_tokens, temperature=0.0)
    hits: dict[str, list[bool]] = {}
    for it, text in zip(items, res.text):
        reply = parse(text, None, style=style).get("content") or ""
        hits.setdefault(it["kind"], []).append(prefers(it["kind"], reply, it["chosen"]))
    every = [h for v in hits.values() for h in v]
    return {"all": sum(every) / len(every)} | {k: sum(v) / len(v) for k, v in sorted(hits.items())}


def task_accuracy(folder: str, task_name: str, level: int, n: int = 200, seed: int = 0,
                  max_new_tokens: int = 16) -> dict[str, float]:  # fmt: skip
    """Greedy held-out accuracy of the model folder on an RL task (its verifier) -> {"accuracy": rate}."""
    from glmstack.inference import Engine
    from glmstack.model import load_hf
    from glmstack.posttrain.rl import rewards as reward_lib
    from glmstack.posttrain.rl.tasks import make_task
    from glmstack.tokenizer import Tokenizer

    tok = Tokenizer.load(folder)
    try:
        task = make_task(task_name, tok)
    except ValueError as e:
        raise SystemExit(f"glmstack dpo eval: {e}") from None
    problems = task.problems(split="test", n=n, seed=seed, level=level)
    res = Engine(load_hf(folder, missing_mtp="drop"), tok).generate(
        [p.prompt_ids for p in problems], max_new_tokens=max_new_tokens, temperature=0.0
    )
    samples = reward_lib.samples_of([p.meta for p in problems], res, max_new_tokens, task.style)
    scores, _ = reward_lib.total(samples, [(r, 1.0) for r in task.rewards])
    return {"accuracy": sum(scores) / max(len(scores), 1)}


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="glmstack dpo eval", description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+", help="model folders (config.json, safetensors, tokenizer.json)")
    ap.add_argument("--n", type=int, default=200, help="held-out checkable prompts")
    ap.add_argument("--seed", type=int, default=0, help="which held-out prompts (synthetic_pairs' or the task's seed)")
    ap.add_argument("--task", help="score an RL task's held-out accuracy instead (e.g. compare)")
    ap.add_argument("--level", type=int, default=3, help="the task's level (with --task)")
    args = ap.parse_args(argv)
    if args.task:
        rows = [(m, task_accuracy(m, args.task, args.level, args.n, args.seed)) for m in args.models]
    else:
        rows = [(m, preferred_rate(m, args.n, args.seed)) for m in args.models]
    cols = list(rows[0][1])
    name = f"{args.task} held-out" if args.task else "preferred"
    print("| model | " + " | ".join(f"{name} ({c})" for c in cols) + " |\n|---" + "|---" * len(cols) + "|")
    for m, r in rows:
        print(f"| {m} | " + " | ".join(f"{r[c]:.3f}" for c in cols) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
