"""`glmstack <stage> <recipe> [--stage NAME] [--set KEY=VALUE ...]`: the command side of every training stage.

One body for every training command (pretrain, midtrain, sft, rl, rm, dpo and the aliases distill, agentic-rl, vl-train,
vl-rl): parse the arguments, resolve the recipe's config (glmstack.recipes.load_config: the recipe's function
`--stage`, by default the first of the command's stage names the recipe has), run the stage the CONFIG'S CLASS names
(`RUNNERS`: an AgenticConfig runs agentic RL whichever command loaded it, a VLTrainConfig a vision-language stage),
turn bad input into one line and exit code 2. So `glmstack rl agentic_speedrun`, `glmstack rl distill_speedrun` and
`glmstack rl vl_tiny` are agentic RL, distillation and VL RL; every stage gets `--resume`, `--stop-at` and
`--print-config`. It lives on the commands' side, not in glmstack/train/stage.py: the training code must not import
the recipes (issue 35).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from glmstack.errors import GlmstackError, one_line
from glmstack.recipes import load_config
from glmstack.train import dist

# config class name -> the stage that runs it; a config runs the entry of the first class in its MRO found here
RUNNERS = {
    "VLRLConfig": "glmstack.multimodal.rl:run_vl_rl",
    "ViTConfig": "glmstack.multimodal.vit_pretrain:run_vit",
    "VLTrainConfig": "glmstack.multimodal.stage:run_vl",
    "DistillConfig": "glmstack.posttrain.rl.distill:run_distill",
    "AgenticConfig": "glmstack.posttrain.agentic.stage:run_agentic",
    "RLConfig": "glmstack.posttrain.rl.stage:run_rl",
    "RMConfig": "glmstack.posttrain.rm.stage:run_rm",
    "DPOConfig": "glmstack.posttrain.dpo.stage:run_dpo",
    "SFTConfig": "glmstack.posttrain.sft:run_sft",
    "TrainConfig": "glmstack.train.stage:run",
}
# a command's recipe functions, in the order tried when --stage is not given
STAGE_NAMES = {"rl": ("rl", "agentic", "distill"), "agentic-rl": ("agentic",), "vl-train": ("sft",), "vl-rl": ("rl",)}


def runner_for(cfg):
    """The run function of the stage `cfg`'s class names (RUNNERS)."""
    for klass in type(cfg).__mro__:
        if klass.__name__ in RUNNERS:
            module, name = RUNNERS[klass.__name__].split(":")
            return getattr(importlib.import_module(module), name)
    raise TypeError(f"no stage runs a {type(cfg).__name__}")


def recipe_stage(recipe: str, command: str) -> str:
    """The recipe function a command runs when --stage is not given: the first of its STAGE_NAMES the recipe has."""
    from glmstack.recipes import recipe_function

    names = STAGE_NAMES.get(command, (command,))
    for name in names[:-1]:
        try:
            recipe_function(recipe, name)
            return name
        except GlmstackError:
            continue
    return names[-1]


def parse_args(argv: list[str] | None, stage: str, description: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=f"glmstack {stage}", description=description)
    p.add_argument("recipe", help="recipe module under glmstack/recipes (e.g. tiny)")
    p.add_argument("--stage", default=None, help="the recipe's stage function (default: the command's)")
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


def main_for(stage: str, description: str, argv: list[str] | None) -> int:
    """The body of `glmstack <stage> <recipe>`: bad input is one clear line and exit code 2."""
    args = parse_args(argv, stage, description)
    try:
        overrides = args.overrides + ([f"ckpt.resume={args.resume}"] if args.resume else [])
        cfg = load_config(args.recipe, args.stage or recipe_stage(args.recipe, stage), overrides)
        if args.print_config:
            from glmstack.config import to_json

            print(to_json(cfg))
            return 0
        result = runner_for(cfg)(cfg, stop_at=args.stop_at)
    except GlmstackError as e:  # a config field, a checkpoint or shard file: one line, no traceback
        print(one_line(f"glmstack {stage}", e), file=sys.stderr, flush=True)
        return 2
    if dist.rank() == 0:
        print(f"{stage} finished: {result}", flush=True)
    dist.shutdown()
    return 0 if result["stopped"] in ("done", "stop_at") else 1
