"""The speedrun's post-training stages, GLM-5's sequence (§3): SFT in GLM's chat format (hybrid thinking, tool calls)
on the synthetic sets → reasoning RL on a procedural task (recipes/rl_speedrun.py) → agentic RL on tool episodes
with on-policy distillation from the reasoning-RL model → general RL (each task's rules + distillation from every
earlier stage's model). Each goes through its stage's own entry point (run_sft, run_rl, run_agentic, run_distill),
so it resumes from its `latest` checkpoint after Ctrl-C and exports an HF model folder with tokenizer and chat
template (<out>/<stage>/model); the last one is the final model.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from glmstack.recipes import speedrun as recipe
from glmstack.speedrun.run import Run


def stage_sft(run: Run) -> dict:
    """SFT on the synthetic chat sets plus a replay of the mid-training text: the row's `replay_share` text records
    per chat record (docs/speedrun.md measures what it keeps of the base model's perplexity and what it costs)."""
    from glmstack.posttrain.sft import run_sft

    cfg = recipe.sft(run.minutes, str(run.out), run.seed)
    if run.size.replay_share:
        n = round(run.size.replay_share * cfg.sft.synthetic_n * len(cfg.sft.data))
        cfg.sft.data = [*cfg.sft.data, str(write_replay(run, n))]
    result = run_sft(cfg)
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


def write_replay(run: Run, n: int, chars: int = 900) -> Path:
    """<out>/sft/replay.jsonl: `n` {"text"} records cut from the mid-training mixture's train split (its held-out
    split, which the card's perplexity reads, stays unseen), at most `chars` characters each, cut at line ends."""
    from glmstack.data.corpus import corpus_docs
    from glmstack.posttrain.sft_data import write_jsonl

    records = []
    for doc in corpus_docs(recipe.corpus_config(run.minutes, run.seed, recipe.MIDTRAIN_SHARES), split="train"):
        piece = ""
        for line in doc.text.splitlines(keepends=True):
            if piece and len(piece) + len(line) > chars:
                records.append({"text": piece})
                piece = ""
            piece += line[:chars]
        records += [{"text": piece}] if piece.strip() else []
    records = [r for r in records if r["text"].strip()]
    random.Random(run.seed).shuffle(records)
    return write_jsonl(records[:n], run.stage_dir("sft") / "replay.jsonl")


def stage_agentic(run: Run) -> dict:
    """Agentic RL on the reasoning-RL model (recipes/speedrun.agentic), or a labelled skip without RL."""
    if "skipped" in run.result("rl") or not run.size.agentic_steps:
        return {"skipped": "no reasoning-RL model" if "skipped" in run.result("rl") else "0 agentic steps in the row"}
    from glmstack.posttrain.agentic.stage import run_agentic

    result = run_agentic(recipe.agentic(run.minutes, str(run.out), run.seed))
    if result["stopped"] != "done":
        raise RuntimeError(f"agentic stopped early: {result['stopped']} (see {run.stage_dir('agentic')})")
    return {"step": result["step"], "checkpoint": result["checkpoint"], "model": result["model"],
            "accepted_trajectories": result["accepted_trajectories"]}


def stage_general(run: Run) -> dict:
    """General RL with distillation from every earlier stage (recipes/speedrun.general), or a labelled skip."""
    if "skipped" in run.result("agentic") or not run.size.general_steps:
        return {"skipped": "no agentic model" if "skipped" in run.result("agentic") else "0 general steps in the row"}
    from glmstack.posttrain.rl.distill import run_distill

    result = run_distill(recipe.general(run.minutes, str(run.out), run.seed))
    if result["stopped"] != "done":
        raise RuntimeError(f"general stopped early: {result['stopped']} (see {run.stage_dir('general')})")
    return {"step": result["step"], "checkpoint": result["checkpoint"], "model": result["model"]}


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


POSTTRAIN = ("sft", "rl", "agentic", "general")  # in order: the last one that ran holds the final model


def final_model(run: Run):
    """The last post-trained model folder (general RL's when every stage ran)."""
    ran = [s for s in POSTTRAIN if (run.stage_dir(s) / "DONE.json").exists() and "model" in run.result(s)]
    return run.stage_dir(ran[-1]) / "model"
