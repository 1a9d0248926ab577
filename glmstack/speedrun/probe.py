"""Score one model of a speedrun on the report card's two function metrics, on a draw the card never uses.

Tuning a post-training stage against the card's own items would fit the card; this scores tool task success (held-out
tool prompts played to the end, the tool really runs) and reasoning task accuracy (`compare` at the row's level)
with the card's definitions on another held-out draw (seed + 1000), greedy, and prints one JSON line. Another draw
is another sample of the calculator's thousands of held-out prompts, but not of the python task's: the tools set
holds out 12 of its 46 prompts, and every draw repeats those 12 (about half of the tool prompts), so on python the
probe and the card score the same prompts.

    python -m glmstack.speedrun.probe runs/speedrun runs/speedrun/rl/model [--n 64]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from glmstack.recipes.speedrun import Size
from glmstack.speedrun import card
from glmstack.speedrun.run import Run

DRAW = 1000  # held-out draw offset: the card draws with the run's seed


def probe(run: Run, model: Path, n: int, reasoning_n: int | None = None, draw: int = DRAW) -> dict:
    """`n` tool prompts and `reasoning_n` (2n) compare problems of held-out draw run.seed + `draw` (0: the card's)."""
    from glmstack.posttrain.evaluate import evaluate
    from glmstack.posttrain.rl.distill import heldout_score
    from glmstack.posttrain.rl.tasks import make_task

    engine, seed = card._engine(run, model), run.seed + draw
    tools = evaluate(engine, card.STYLE, sets=("tools",), n=n, seed=seed, max_new_tokens=card.MAX_NEW_TOKENS)
    task = make_task("compare", run.tokenizer(), card.STYLE)
    reasoning_n = reasoning_n or 2 * n
    reasoning = heldout_score(engine, task, reasoning_n, seed, run.size.rl_level, card.REASONING_TOKENS, card.STYLE)
    t = tools["tools"]
    return {"model": str(model), "tool task success": t["score"], "tool-call validity": t["tool_call_valid"],
            "well-formed turns": t["well_formed"], "reasoning task accuracy": reasoning, "n": n}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m glmstack.speedrun.probe", description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="the speedrun's folder (its speedrun.json gives the seed and size)")
    ap.add_argument("model", type=Path, help="a chat model folder, e.g. <run>/rl/model")
    ap.add_argument("--n", type=int, default=64, help="tool prompts (and 2n reasoning problems)")
    args = ap.parse_args(argv)
    meta = json.loads((args.run / "speedrun.json").read_text())
    run = Run(out=args.run, seed=meta["seed"], minutes=meta["minutes"], size=Size(**meta["size"]))
    print(json.dumps(probe(run, args.model, args.n)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
