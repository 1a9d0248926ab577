"""`glmstack expert-iteration <recipe>`: GLM-4.5's expert models, then self-distillation into one model.

GLM-4.5 §3.1 trains a reasoning, an agent (tool-use) and a general-chat expert from the same base, then distils
them into one hybrid model by an overall SFT on their outputs. Here, with the recipe's stages `sft_reasoning`,
`sft_tools`, `sft_chat` and `sft_merged` (glmstack/recipes/sft_speedrun.py), which all start from the same base
(their `init_from`; in sft_speedrun the cold-start model of `glmstack sft sft_speedrun`):
  1. each expert = `glmstack sft` of the base on its one synthetic set (<run>/expert_<name>/model)
  2. each expert rejection-samples its set's training prompts (glmstack.posttrain.rejection) -> rs_<name>.jsonl
  3. the merged model = SFT of the same base on the overall mix (<run>/expert_merged/model): the recipe's own data
     (sft_speedrun: the experts' three training sets, for their steps together) plus the three sampled files, each
     repeated `rs_weight` times (GLM-4.5 §3.1 distils the experts' outputs into one model within an overall SFT
     mix; on their sampled outputs alone, a few dozen conversations at this size, the merged model kept 90% of chat
     and 36% of tools). `--seeds 0,1,2` trains it once per seed (<run>/expert_merged_seed<S>/model), same files
  4. every expert and merged model are scored on the same held-out prompts of each expert's set (greedy); the
     table (`kept` = merged / expert, per seed, mean and min) goes to <run>/expert_iteration.md and .json
Finished steps are skipped on a re-run (each SFT resumes from its checkpoints; a sampled file is reused).

    glmstack expert-iteration sft_speedrun [--set steps=60 ...] [--n-sample 150] [--n-eval 50] [--rs-weight 4]
        [--seeds 0,1,2]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from glmstack.config import ConfigError

EXPERTS = ("reasoning", "tools", "chat")  # the recipe's stages sft_<name>; each trains on one synthetic set


def expert_set(cfg) -> str:
    """The synthetic set an expert trains on (its sft.data is exactly one "synthetic:<set>"): the set whose training
    prompts it samples and whose held-out prompts score it."""
    from glmstack.posttrain.sft import SYNTHETIC

    data = cfg.sft.data
    if len(data) != 1 or not data[0].startswith(SYNTHETIC):
        raise ConfigError(f"{cfg.stage}: an expert trains on one synthetic:<set> (sft.data = {data})")
    return data[0][len(SYNTHETIC) :]


def expert_iteration(
    load_config,
    n_sample: int,
    n_eval: int,
    rejection=None,
    rs_weight: int = 4,
    seeds: list[int] | None = None,
) -> dict:
    """Experts -> samples -> one merged model per seed in `seeds` (default: the recipe's seed) -> scores:
    {set: {"expert": score, "merged": {seed: score}, "kept": {seed: merged / expert}}}. `load_config(stage,
    overrides)` is the recipe's TrainConfig of `stage` with the `key=value` overrides (main() binds the recipe
    name: resolving a recipe is the command's part, glmstack.recipes.load_config)."""
    from glmstack.posttrain.evaluate import items_of, load_engine
    from glmstack.posttrain.rejection import RejectionConfig, rejection_sample
    from glmstack.posttrain.sft import run_sft
    from glmstack.posttrain.sft_data import write_jsonl
    from glmstack.posttrain.synthetic import generate
    from glmstack.train.stage import stage_dir

    # tiny sets: keep every solved prompt; a cooler temperature keeps a small model's format intact
    rejection = rejection or RejectionConfig(drop_shortest=0.0, temperature=0.6)
    models, sets, files = {}, {}, []
    for name in EXPERTS:
        cfg = load_config(f"sft_{name}", [])
        sets[name], models[name] = expert_set(cfg), Path(stage_dir(cfg)) / "model"
        if not (models[name] / "config.json").exists():
            print(f"== expert {name}: SFT on {sets[name]}", flush=True)
            run_sft(cfg)
        path = Path(stage_dir(cfg)).parent / f"rs_{name}.jsonl"
        if not path.exists():
            print(f"== expert {name}: rejection sampling {n_sample} {sets[name]} prompts", flush=True)
            items = items_of(generate(sets[name], n_sample, cfg.seed, "train"))
            records, report = rejection_sample(load_engine(str(models[name])), items, cfg.sft.chat_style, rejection)
            if not records:
                raise ConfigError(f"expert {name} kept no sample: {json.dumps(report['dropped'])}")
            write_jsonl(records, path)
            path.with_suffix(".report.json").write_text(json.dumps(report, indent=2) + "\n")
            print(f"   kept {report['kept']} of {report['samples']}: dropped {report['dropped']}", flush=True)
        files.append(str(path))
    base = load_config("sft_merged", [])
    out = Path(stage_dir(base)).parent
    # every model on the same n_eval held-out prompts of each expert's set, greedy; the table is rewritten after
    # each merged seed, so a long run shows the finished seeds
    scores = {s: {"expert": held_out_score(models[name], base.sft.chat_style, s, n_eval), "merged": {}, "kept": {}}
              for name, s in sets.items()}  # fmt: skip
    for seed in seeds if seeds is not None else [base.seed]:
        # the first seed's model is <run>/expert_merged; others <run>/expert_merged_seed<S> (same data files)
        stage = base.stage if seed == base.seed else f"{base.stage}_seed{seed}"
        mix = json.dumps(base.sft.data + files * rs_weight)
        cfg = load_config("sft_merged", [f"seed={seed}", f"stage={stage}", f"sft.data={mix}"])
        model = Path(stage_dir(cfg)) / "model"
        if not (model / "config.json").exists():
            print(f"== merged model, seed {seed}: SFT on {cfg.sft.data}", flush=True)
            run_sft(cfg)
        for s, v in scores.items():
            v["merged"][seed] = held_out_score(model, base.sft.chat_style, s, n_eval)
            v["kept"][seed] = v["merged"][seed] / v["expert"] if v["expert"] else None
        (out / "expert_iteration.json").write_text(json.dumps(scores, indent=2) + "\n")
        (out / "expert_iteration.md").write_text(table(scores) + "\n")
        print(table(scores), flush=True)
    return scores


def held_out_score(folder: Path, style: str, set_name: str, n: int) -> float:
    from glmstack.posttrain.evaluate import evaluate, load_engine

    return evaluate(load_engine(str(folder)), style, [set_name], n)[set_name]["score"]


def table(scores: dict) -> str:
    """One row per held-out set: the expert's score, each merged seed's score (kept = merged / expert), the mean
    and the smallest kept fraction."""
    seeds = list(next(iter(scores.values()))["merged"])
    head = "| held-out set | expert | " + " | ".join(f"merged, seed {s} (kept)" for s in seeds)
    rows = [head + " | kept, mean | kept, min |", "|---" * (len(seeds) + 4) + "|"]
    for s, v in scores.items():
        kept = [k for k in v["kept"].values() if k is not None]
        cells = [f"{v['merged'][seed]:.1%} ({_pct(v['kept'][seed])})" for seed in seeds]
        mean, low = (_pct(sum(kept) / len(kept)), _pct(min(kept))) if kept else ("-", "-")
        rows.append(f"| {s} | {v['expert']:.1%} | " + " | ".join(cells) + f" | {mean} | {low} |")
    return "\n".join(rows)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def main(argv: list[str] | None = None) -> int:
    from glmstack.recipes import load_config

    ap = argparse.ArgumentParser(prog="glmstack expert-iteration", description=__doc__.splitlines()[0])
    ap.add_argument("recipe", help="recipe module with sft_reasoning/sft_tools/sft_chat/sft_merged stages")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a field of every stage's config (repeatable)")  # fmt: skip
    ap.add_argument("--n-sample", type=int, default=150, help="training prompts rejection-sampled per expert")
    ap.add_argument("--n-eval", type=int, default=50, help="held-out prompts per set")
    ap.add_argument("--rs-weight", type=int, default=4, help="times each expert's sampled file is in the merged mix")
    ap.add_argument("--seeds", default=None, help="train the merged model once per seed (comma list, e.g. 0,1,2)")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    try:
        seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else None
    except ValueError:
        print(f"glmstack expert-iteration: --seeds {args.seeds!r}: expected integers like 0,1,2", file=sys.stderr)
        return 2
    try:
        load = lambda stage, extra: load_config(args.recipe, stage, args.overrides + extra)
        expert_iteration(load, args.n_sample, args.n_eval, rs_weight=args.rs_weight, seeds=seeds)
    except ConfigError as e:
        print(f"glmstack expert-iteration: {e}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
