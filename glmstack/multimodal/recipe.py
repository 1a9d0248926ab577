"""`glmstack vl-recipe <recipe>`: the tiny multimodal recipe's stages in order, then a report with a table and
sample images.

Stages (the recipe module's functions): vit (the ViT + adapter pre-trained on the images' attributes) -> align
(adapter only) -> sft (everything) -> rl (RLCS), each a config the recipe returns (glmstack/recipes/vl_tiny.py), each
run by its own module (multimodal/vit_pretrain.py, multimodal/stage.py, multimodal/rl.py). A
stage whose model folder and eval.json exist is skipped, so a re-run resumes where the last one stopped. The report
(<out_dir>/<run>/report.md + report.json) has, per stage: steps, wall and process CPU time, the load average while
it ran (the machine may be shared), and held-out accuracy overall and per question kind; then the first held-out
samples of the final model with their images (copied beside the report).

    glmstack vl-recipe vl_tiny
    glmstack vl-recipe vl_tiny --set out_dir=/tmp/runs --vit steps=100 --sft steps=200 --rl steps=10
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

STAGES = ("vit", "align", "sft", "rl")


def run_stage(name: str, cfg) -> dict:
    """Run one stage (or read its finished result) -> {"stage", "steps", "wall_s", "cpu_s", "load", "eval"}."""
    from glmstack.multimodal.stage import stage_dir

    folder = stage_dir(cfg)
    done = folder / "stage_result.json"
    if done.exists() and (folder / "model").is_dir():
        print(f"{name}: already done ({done})", flush=True)
        return json.loads(done.read_text())
    wall, cpu, load = time.perf_counter(), time.process_time(), os.getloadavg()[0]
    if name == "rl":
        from glmstack.multimodal.rl import run_vl_rl as run
    elif name == "vit":
        from glmstack.multimodal.vit_pretrain import run_vit as run
    else:
        from glmstack.multimodal.stage import run_vl as run
    result = run(cfg)
    if result["stopped"] != "done":
        raise RuntimeError(f"stage {name} stopped: {result['stopped']}")
    eval_path = folder / "eval.json"
    out = {"stage": name, "steps": cfg.steps, "wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu,
           "load": [load, os.getloadavg()[0]], "eval": json.loads(eval_path.read_text()) if eval_path.exists() else None,
           "train": "ViT+heads" if name == "vit" else getattr(getattr(cfg, "vl", None), "train", "rl")}  # fmt: skip
    done.write_text(json.dumps(out, indent=2) + "\n")
    return out


def report(rows: list[dict], folder: Path) -> Path:
    """report.md: the stage table, then the final model's held-out samples with their images."""
    kinds = sorted({k for r in rows if r["eval"] for k in r["eval"]["by_kind"]})
    head = "| stage | trains | steps | wall | CPU | load avg | held-out acc | " + " | ".join(kinds) + " |"
    lines = ["# Tiny multimodal recipe", "", head, "|" + "---|" * (7 + len(kinds))]
    for r in rows:
        ev = r["eval"] or {"accuracy": float("nan"), "by_kind": {}, "n": 0}
        cells = [r["stage"], r["train"], str(r["steps"]), f"{r['wall_s'] / 60:.1f} min", f"{r['cpu_s'] / 60:.1f} min",
                 "{:.1f} -> {:.1f}".format(*r["load"]), f"{ev['accuracy']:.1%} (n={ev['n']})"]  # fmt: skip
        cells += [f"{ev['by_kind'].get(k, float('nan')):.0%}" for k in kinds]
        lines.append("| " + " | ".join(cells) + " |")
    total_wall, total_cpu = sum(r["wall_s"] for r in rows), sum(r["cpu_s"] for r in rows)
    lines += ["", f"Total: {total_wall / 60:.1f} min wall, {total_cpu / 60:.1f} min process CPU."]
    if any(r["stage"] == "vit" for r in rows):
        lines.append("The vit row scores the ViT's attribute heads on the held-out images (no chat yet); the others "
                     "score the chat model's greedy boxed answers.")
    lines.append("")
    last = next((r for r in reversed(rows) if r["eval"]), None)
    if last:
        (folder / "samples").mkdir(exist_ok=True)
        lines += [f"## Held-out samples ({last['stage']} model, greedy)", "", "| image | question | answer | reply |",
                  "|---|---|---|---|"]  # fmt: skip
        for i, s in enumerate(last["eval"]["samples"]):
            name = f"samples/{i:02d}.png"
            shutil.copy(s["image"], folder / name)
            mark = "ok" if s["correct"] else "WRONG"
            reply = " ".join(s["reply"].split()).replace("|", "\\|")  # one table cell
            lines.append(f"| ![]({name}) | {s['question']} | {s['answer']} | `{reply}` ({mark}) |")
    path = folder / "report.md"
    path.write_text("\n".join(lines) + "\n")
    (folder / "report.json").write_text(json.dumps(rows, indent=2) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    from glmstack.config import apply_overrides
    from glmstack.errors import GlmstackError, one_line
    from glmstack.recipes import recipe_function

    ap = argparse.ArgumentParser(prog="glmstack vl-recipe", description=__doc__.splitlines()[0])
    ap.add_argument("recipe", help="recipe module under glmstack/recipes (e.g. vl_tiny)")
    ap.add_argument("--set", dest="common", action="append", default=[], metavar="KEY=VALUE",
                    help="override a field of every stage (e.g. out_dir=..., seed=1)")
    for name in STAGES:
        ap.add_argument(f"--{name}", action="append", default=[], metavar="KEY=VALUE", help=f"override a {name} field")
    args = ap.parse_args(argv)
    rows = []
    try:
        for name in STAGES:
            cfg = apply_overrides(recipe_function(args.recipe, name)(), args.common + getattr(args, name))
            rows.append(run_stage(name, cfg))
    except GlmstackError as e:
        print(one_line("glmstack vl-recipe", e), file=sys.stderr, flush=True)
        return 2
    path = report(rows, Path(cfg.out_dir) / cfg.run)
    print(path.read_text())
    print(f"report: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
