"""The speedrun's post-training stages: SFT in GLM's chat format (hybrid thinking, tool calls) on the synthetic
sets, then reasoning RL on a procedural task (GLM-4.5 §3.1-3.2; recipes/rl_speedrun.py). Both go through the stages' own entry points
(glmstack.posttrain.sft.run_sft, glmstack.posttrain.rl.stage.run_rl), so they resume from their `latest` checkpoint
after Ctrl-C and export an HF model folder with tokenizer and chat template (<out>/sft/model, <out>/rl/model).
"""

from __future__ import annotations

import json

from glmstack.recipes import speedrun as recipe
from glmstack.speedrun.run import Run


def stage_sft(run: Run) -> dict:
    from glmstack.posttrain.sft import run_sft

    result = run_sft(recipe.sft(run.minutes, str(run.out), run.seed))
    if result["stopped"] != "done":
        raise RuntimeError(f"sft stopped early: {result['stopped']} (see {run.stage_dir('sft')})")
    return {k: result[k] for k in ("step", "tokens", "val_loss", "loss", "checkpoint", "model")}


def stage_rl(run: Run) -> dict:
    """GRPO on the SFT model, or a labelled skip while this checkout has no RL stage (the report says so)."""
    cfg = recipe.rl(run.minutes, str(run.out), run.seed)
    if cfg is None or not run.size.rl_steps:
        why = "glmstack.posttrain.rl has no stage in this checkout" if cfg is None else "the budget row has 0 RL steps"
        print(f"rl: skipped ({why}); the SFT model is the final model", flush=True)
        return {"skipped": why}
    from glmstack.posttrain.rl.stage import run_rl

    result = run_rl(cfg)
    if result["stopped"] != "done":
        raise RuntimeError(f"rl stopped early: {result['stopped']} (see {run.stage_dir('rl')})")
    return {"step": result["step"], "checkpoint": result["checkpoint"], "model": result["model"],
            "heldout_acc": result["heldout_acc"], "heldout_acc_start": _first_heldout(run)}


def _first_heldout(run: Run) -> float | None:
    """The RL task's held-out accuracy of the SFT model: RL's evaluation before its first step."""
    path = run.stage_dir("rl") / "metrics.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        for key, value in row.items():
            if key.startswith("heldout") and "sampled" not in key and isinstance(value, (int, float)):
                return value
    return None


def final_model(run: Run):
    """The last post-trained model folder: RL's when it ran, else SFT's."""
    rl = run.result("rl")
    return run.stage_dir("rl") / "model" if "model" in rl else run.stage_dir("sft") / "model"
