"""`glmstack ablate [CLAIM ...] [--seeds 3] [--budget-minutes M] [--out DIR]`: the GLM papers' design claims,
measured at small scale with 95% intervals over seeds.

    glmstack ablate --list                                  # the claims, their arms and checks
    glmstack ablate --seeds 3 --budget-minutes 60           # all claims; sizes scaled to fit an hour here
    glmstack ablate muon qk_norm --seeds 5 --out runs/abl   # two claims; rerun the same command to resume
    glmstack ablate --report --out runs/abl                 # redraw ablations.md and plots from the stored results
    glmstack ablate --recipe ablate_gpu --seeds 5 --budget-minutes 120   # the larger version (GPU; unverified)

Writes DIR/ablations.md (the table), DIR/plots/<claim>.png, DIR/results.json (raw), DIR/results/<claim>/<arm>/
seed<k>.json (one per run, atomic; a rerun skips them), DIR/plan.json (the sizes), DIR/progress.log.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from glmstack.ablate import claim as claims_mod
from glmstack.ablate import report, runner
from glmstack.config import ConfigError


def parse_args(argv):
    p = argparse.ArgumentParser(prog="glmstack ablate", description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("claims", nargs="*", help="claims to run (default: the GLM-4.5 / GLM-5 ten; --list shows all)")
    p.add_argument("--seeds", type=int, default=3, help="seeds per arm (>= 2 for an interval; default 3)")
    p.add_argument("--budget-minutes", type=float, default=None,
                   help="scale every stage's steps so the whole set fits this wall time here (default: scale 1)")
    p.add_argument("--scale", type=float, default=None, help="an explicit step scale instead of a budget")
    p.add_argument("--out", default="runs/ablate", help="output folder (default runs/ablate)")
    p.add_argument("--recipe", default="ablate", help="base recipe the claims' 'ablate' stages use (ablate_gpu: larger)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1: runs share the machine fairly)")
    p.add_argument("--keep-runs", action="store_true", help="keep the training folders (default: deleted once measured)")
    p.add_argument("--report", action="store_true", help="only redraw the report from stored results")
    p.add_argument("--list", action="store_true", help="list the claims and exit")
    return p.parse_args(argv)


def selected(names: list[str], recipe: str) -> list:
    chosen = [claims_mod.load(n) for n in (names or claims_mod.default_names())]
    if recipe != "ablate":
        from glmstack.recipes import recipe_function

        recipe_function(recipe, "pretrain")  # an unknown recipe is one clear error now, not after an hour
        chosen = [claims_mod.with_base_recipe(c, recipe) for c in chosen]
    return chosen


def list_claims() -> None:
    for name in claims_mod.names():
        c = claims_mod.load(name)
        print(f"{name:<18} {c.source}: {c.statement}" + ("" if c.default else " (only when named)"))
        print(f"{'':<18} arms: {', '.join(c.arms)}; checks: "
              + "; ".join(f"{k.metric} ({k.kind}, {k.better})" for k in c.checks))


def make_or_read_plan(args, claims, out: Path, say) -> dict:
    """plan.json of an earlier run with the same request, or a new plan (probing the machine for a budget)."""
    request = {"claims": [c.name for c in claims], "seeds": args.seeds, "budget_minutes": args.budget_minutes,
               "scale_arg": args.scale, "recipe": args.recipe}
    old = runner.read_plan(out)
    if old is not None and old.get("request") == request:
        say(f"resuming the plan in {out / 'plan.json'} (scale {old['scale']})")
        return old
    sec = runner.probe_seconds_per_step(out, args.recipe) if args.budget_minutes else 0.0
    plan = runner.make_plan(claims, args.seeds, args.budget_minutes, sec)
    if args.scale is not None:
        plan = runner.make_plan(claims, args.seeds, None, sec) | {"scale": args.scale}
        plan["steps"] = runner.scaled_steps(claims, args.scale)
    plan |= {"request": request, "load_avg_at_start": round(os.getloadavg()[0], 1)}
    runner.write_plan(out, plan)
    say(f"plan: scale {plan['scale']} of each claim's steps, {args.seeds} seeds, "
        + (f"estimated {plan['estimate_min']} min at {sec:.3f} s per {args.recipe} step (probe, load "
           f"{plan['load_avg_at_start']})" if args.budget_minutes else "no budget given"))
    return plan


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        list_claims()
        return 0
    if args.seeds < 1:
        raise ConfigError("--seeds must be >= 1 (>= 2 for an interval)")
    claims = selected(args.claims, args.recipe)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    say = runner.log_to(out / "progress.log")
    import torch

    torch.set_num_threads(args.threads)
    if args.report:
        plan = runner.read_plan(out)
        if plan is None:
            raise ConfigError(f"{out}: no plan.json; run the claims first")
    else:
        plan = make_or_read_plan(args, claims, out, say)
        t0 = time.perf_counter()
        runner.run_all(claims, plan, out, keep_runs=args.keep_runs, say=say)
        say(f"all runs done in {(time.perf_counter() - t0) / 60:.1f} min")
    table = runner.collect(claims, plan, out)
    path = report.write(claims, table, plan, out, command="glmstack ablate " + " ".join(argv or sys.argv[1:]))
    say(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
