"""`glmstack <stage> <recipe> [--set KEY=VALUE ...]`: the command side of every training stage.

One body for pretrain, midtrain, sft, rl, rm, distill and agentic-rl: parse the arguments, resolve the recipe's
config (glmstack.recipes.load_config), run the stage's function, turn bad input into one line and exit code 2. Each
stage module's `main(argv)` (what cli.py's table calls) is `main_for(<stage>, <description>, argv, run_fn=...)`.
It lives on the commands' side, not in glmstack/train/stage.py: the training code must not import the recipes
(issue 35).
"""

from __future__ import annotations

import argparse
import sys

from glmstack.errors import GlmstackError, one_line
from glmstack.recipes import load_config
from glmstack.train import dist
from glmstack.train.stage import run


def parse_args(argv: list[str] | None, stage: str, description: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=f"glmstack {stage}", description=description)
    p.add_argument("recipe", help="recipe module under glmstack/recipes (e.g. tiny)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config field, e.g. --set optim.lr=3e-4 (repeatable)",
    )
    p.add_argument("--resume", default=None, help="auto (default: continue from latest), never, or a step folder")
    p.add_argument("--stop-at", type=int, default=None, help="stop this process at this step (with a checkpoint)")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    return p.parse_args(argv)


def main_for(stage: str, description: str, argv: list[str] | None, run_fn=None) -> int:
    """The body of `glmstack <stage> <recipe>`: bad input is one clear line and exit code 2."""
    args = parse_args(argv, stage, description)
    try:
        overrides = args.overrides + ([f"ckpt.resume={args.resume}"] if args.resume else [])
        cfg = load_config(args.recipe, stage, overrides)
        if args.print_config:
            from glmstack.config import to_json

            print(to_json(cfg))
            return 0
        result = (run_fn or run)(cfg, stop_at=args.stop_at)
    except GlmstackError as e:  # a config field, a checkpoint or shard file: one line, no traceback
        print(one_line(f"glmstack {stage}", e), file=sys.stderr, flush=True)
        return 2
    if dist.rank() == 0:
        print(f"{stage} finished: {result}", flush=True)
    dist.shutdown()
    return 0 if result["stopped"] in ("done", "stop_at") else 1
