"""`glmstack expert-iteration <recipe>`: GLM-4.5's expert models, then self-distillation into one model.

GLM-4.5 §3.1 trains a reasoning, an agent (tool-use) and a general-chat expert from the same base, then distils
them into one hybrid model by an overall SFT on their outputs. Here, with the recipe's stages `sft_reasoning`,
`sft_tools`, `sft_chat` and `sft_merged` (glmstack/recipes/sft_speedrun.py), which all start from the same base
(their `init_from`; in sft_speedrun the cold-start model of `glmstack sft sft_speedrun`):
  1. each expert = `glmstack sft` of the base on its synthetic set (<run>/expert_<name>/model)
  2. each expert rejection-samples its set's training prompts (glmstack.posttrain.rejection) -> rs_<name>.jsonl
  3. the merged model = SFT of the same base on the overall mix (<run>/expert_merged/model): the recipe's own data
     (sft_speedrun: the experts' three training sets) plus the three sampled files, each repeated `rs_weight`
     times (GLM-4.5 §3.1 distils the experts' outputs into one model within an overall SFT mix; on their sampled
     outputs alone, a few dozen conversations at this size, the merged model kept 93% of chat but 67% of tools)
  4. every expert and the merged model are scored on held-out prompts of each expert's set; the table (and
     `kept` = merged / expert) goes to <run>/expert_iteration.md and .json
Finished steps are skipped on a re-run (each SFT resumes from its checkpoints; a sampled file is reused).

    glmstack expert-iteration sft_speedrun [--set steps=60 ...] [--n-sample 150] [--n-eval 50] [--rs-weight 4]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from glmstack.config import ConfigError

EXPERTS = {"reasoning": "arithmetic", "tools": "tools", "chat": "chat"}


def expert_iteration(recipe: str, overrides: list[str], n_sample: int, n_eval: int, rejection=None,
                     rs_weight: int = 4) -> dict:
    from glmstack.posttrain.evaluate import evaluate, items_of, load_engine
    from glmstack.posttrain.rejection import RejectionConfig, rejection_sample
    from glmstack.posttrain.sft import run_sft
    from glmstack.posttrain.sft_data import write_jsonl
    from glmstack.posttrain.synthetic import generate
    from glmstack.train.stage import load_config, stage_dir

    # tiny sets: keep every solved prompt; a cooler temperature keeps a small model's format intact
    rejection = rejection or RejectionConfig(drop_shortest=0.0, temperature=0.6)
    models, files = {}, []
    for name, set_name in EXPERTS.items():
        cfg = load_config(recipe, f"sft_{name}", overrides)
        models[name] = Path(stage_dir(cfg)) / "model"
        if not (models[name] / "config.json").exists():
            print(f"== expert {name}: SFT on {set_name}", flush=True)
            run_sft(cfg)
        path = Path(stage_dir(cfg)).parent / f"rs_{name}.jsonl"
        if not path.exists():
            print(f"== expert {name}: rejection sampling {n_sample} {set_name} prompts", flush=True)
            items = items_of(generate(set_name, n_sample, cfg.seed, "train"))
            records, report = rejection_sample(load_engine(str(models[name])), items, cfg.sft.chat_style, rejection)
            if not records:
                raise ConfigError(f"expert {name} kept no sample: {json.dumps(report['dropped'])}")
            write_jsonl(records, path)
            path.with_suffix(".report.json").write_text(json.dumps(report, indent=2) + "\n")
            print(f"   kept {report['kept']} of {report['samples']}: dropped {report['dropped']}", flush=True)
        files.append(str(path))
    cfg = load_config(recipe, "sft_merged", overrides)
    cfg = load_config(recipe, "sft_merged", overrides + [f"sft.data={json.dumps(cfg.sft.data + files * rs_weight)}"])
    models["merged"] = Path(stage_dir(cfg)) / "model"
    if not (models["merged"] / "config.json").exists():
        print(f"== merged model: SFT on {cfg.sft.data}", flush=True)
        run_sft(cfg)
    scores: dict[str, dict] = {}
    for name, set_name in EXPERTS.items():
        for who in (name, "merged"):
            res = evaluate(load_engine(str(models[who])), cfg.sft.chat_style, [set_name], n_eval)[set_name]
            scores.setdefault(set_name, {})[who if who == "merged" else "expert"] = res["score"]
    for s in scores.values():
        s["kept"] = s["merged"] / s["expert"] if s["expert"] else None
    out = Path(stage_dir(cfg)).parent
    (out / "expert_iteration.json").write_text(json.dumps(scores, indent=2) + "\n")
    (out / "expert_iteration.md").write_text(table(scores) + "\n")
    return scores


def table(scores: dict) -> str:
    rows = ["| held-out set | expert score | merged score | merged / expert |", "|---|---|---|---|"]
    for s, v in scores.items():
        kept = "-" if v["kept"] is None else f"{v['kept']:.0%}"
        rows.append(f"| {s} | {v['expert']:.1%} | {v['merged']:.1%} | {kept} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="glmstack expert-iteration", description=__doc__.splitlines()[0])
    ap.add_argument("recipe", help="recipe module with sft_reasoning/sft_tools/sft_chat/sft_merged stages")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a field of every stage's config (repeatable)")  # fmt: skip
    ap.add_argument("--n-sample", type=int, default=150, help="training prompts rejection-sampled per expert")
    ap.add_argument("--n-eval", type=int, default=50, help="held-out prompts per set")
    ap.add_argument("--rs-weight", type=int, default=4, help="times each expert's sampled file is in the merged mix")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    try:
        scores = expert_iteration(args.recipe, args.overrides, args.n_sample, args.n_eval, rs_weight=args.rs_weight)
    except ConfigError as e:
        print(f"glmstack expert-iteration: {e}", file=sys.stderr, flush=True)
        return 2
    print(table(scores))
    return 0


if __name__ == "__main__":
    sys.exit(main())
