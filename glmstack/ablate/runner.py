"""Run the claims: a plan sized to the budget, arms interleaved by seed, every (claim, arm, seed) stored atomically.

Order: for each seed, for each claim, for each arm -> train the arm's stages (the one loop, glmstack/train/loop.py)
-> measure -> write results/<claim>/<arm>/seed<k>.json through a temporary file (glmstack/atomic.py). So load drift
on a shared machine hits every arm of a seed alike, a stopped run leaves every claim with the same seeds done,
and a rerun with the same --out skips finished results (and stages whose `ablate_done.json` exists).

Sizing: every stage declares its steps at scale 1 and a relative cost per step (Stage.cost, in steps of the base
ablate recipe). A probe times the tiny recipe's steps on this machine now; the scale is budget / estimated time, and the
resulting plan (steps per stage) is written to plan.json, which later runs with the same --out reuse.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from glmstack.ablate.claim import Claim, Stage
from glmstack.atomic import write_atomic
from glmstack.config import ConfigError

MIN_STEPS = 8  # fewer steps than this measures nothing
MEASURE_COST = 40  # building, saving and measuring an arm, in base-recipe steps, per arm and seed


@dataclass
class ArmRun:
    """What a claim's measure function sees for one (arm, seed): the stages' configs, folders and loop results."""

    arm: str
    seed: int
    cfgs: dict = field(default_factory=dict)  # stage name -> TrainConfig
    dirs: dict = field(default_factory=dict)  # stage name -> stage folder
    results: dict = field(default_factory=dict)  # stage name -> the loop's summary
    last: str = ""  # the arm's final stage

    @property
    def cfg(self):
        return self.cfgs[self.last]

    def rows(self, stage: str | None = None) -> list[dict]:
        from glmstack.train.metrics import read_metrics

        return read_metrics(self.dirs[stage or self.last] / "metrics.jsonl")

    def checkpoint(self, stage: str | None = None) -> Path:
        from glmstack.train import checkpoint

        return checkpoint.latest(self.dirs[stage or self.last])

    def model(self, stage: str | None = None):
        import torch

        from glmstack.model import load_hf

        return load_hf(self.checkpoint(stage), dtype=torch.float32).eval()


# ---------------------------------------------------------------------------------------------------- sizing


def probe_seconds_per_step(out: Path, recipe: str = "ablate", steps: int = 6) -> float:
    """Median wall seconds of one step of the base recipe on this machine now (after its first step)."""
    stage = Stage(name="probe", recipe=recipe, overrides={"log.val_every": 0})
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        cfg = stage_config(stage, seed=0, steps=steps, out_dir=Path(tmp))
        train_stage(stage, cfg, Path(tmp) / "probe.log")
        rows = read_rows(Path(tmp) / cfg.run / cfg.stage)
    tokens_per_step = cfg.micro_batch_size * cfg.seq_len * cfg.grad_accum
    return statistics.median(tokens_per_step / r["tok_per_s"] for r in rows[1:])


def estimate_seconds(claims: list[Claim], seeds: int, sec_per_step: float, scale: float) -> float:
    """Wall seconds of the whole set at `scale` (shared stages counted once per seed)."""
    total = 0.0
    for c in claims:
        total += sum(max(MIN_STEPS, round(s.steps * scale)) * s.cost for s in c.stage_table().values())
        total += MEASURE_COST * len(c.arms)
    return total * seeds * sec_per_step


def scaled_steps(claims: list[Claim], scale: float) -> dict[str, dict[str, int]]:
    return {c.name: {s.name: max(MIN_STEPS, round(s.steps * scale)) for s in c.stage_table().values()}
            for c in claims}


def make_plan(claims: list[Claim], seeds: int, budget_minutes: float | None, sec_per_step: float) -> dict:
    """{"scale", "seeds", "estimate_min", "steps": {claim: {stage: steps}}}: the largest scale that fits the budget."""
    scale = 1.0
    if budget_minutes:
        fixed = estimate_seconds(claims, seeds, sec_per_step, 0.0)
        per_unit = estimate_seconds(claims, seeds, sec_per_step, 1.0) - fixed
        scale = max(0.0, (budget_minutes * 60 - fixed) / per_unit) if per_unit > 0 else 1.0
    steps = scaled_steps(claims, scale)
    return {"scale": round(scale, 4), "seeds": seeds, "budget_minutes": budget_minutes,
            "sec_per_step": round(sec_per_step, 4),
            "estimate_min": round(estimate_seconds(claims, seeds, sec_per_step, scale) / 60, 1), "steps": steps}


# ---------------------------------------------------------------------------------------------------- one stage


def stage_config(stage: Stage, *, seed: int, steps: int, out_dir: Path, init_from: str = "", data: Path | None = None):
    """The stage's TrainConfig: the recipe function, the stage's sized overrides, then the runner's own fields."""
    from glmstack.recipes import load_config

    own = {"out_dir": str(out_dir), "run": f"seed{seed}", "stage": f"{stage.name}_{steps}", "seed": seed,
           "ckpt.every": 0, "ckpt.keep_last": 1, "log.progress": False, "log.plots": False}
    if "log.val_every" not in stage.overrides:
        own |= {"log.val_every": steps, "log.val_batches": 16}
    if init_from:
        own["init_from"] = init_from
    sets = stage.set_args(steps, data) + [f"{k}={json.dumps(v)}" for k, v in own.items()]
    return load_config(stage.recipe, stage.fn, sets)


def train_stage(stage: Stage, cfg, log: Path) -> dict:
    """Run one stage through the one loop (RL through its stage), its output to `log`; -> the loop's summary."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
        if stage.kind == "rl":
            from glmstack.posttrain.rl.stage import run_rl

            return run_rl(cfg)
        from glmstack.train.stage import run

        return run(cfg)


def read_rows(folder: Path) -> list[dict]:
    from glmstack.train.metrics import read_metrics

    return read_metrics(folder / "metrics.jsonl")


def run_arm(claim: Claim, arm: str, seed: int, steps: dict[str, int], out: Path) -> ArmRun:
    """Train the arm's stages (reusing a stage another arm of this seed already finished); -> ArmRun."""
    runs_root = out / "runs" / claim.name
    run = ArmRun(arm=arm, seed=seed)
    for stage in claim.arms[arm]:
        n = steps[stage.name]
        init = f"seed{seed}/{stage.init_from}_{steps[stage.init_from]}" if stage.init_from else ""
        cfg = stage_config(stage, seed=seed, steps=n, out_dir=runs_root, init_from=init, data=data_dir(claim, out))
        folder = runs_root / cfg.run / cfg.stage
        done = folder / "ablate_done.json"
        if done.exists():
            result = json.loads(done.read_text())
        else:
            result = train_stage(stage, cfg, folder / "train.log")
            if result.get("stopped") not in ("done", "bad_steps"):
                raise RuntimeError(f"{claim.name}/{arm} seed {seed}: stage {stage.name} stopped: {result}")
            write_atomic(done, json.dumps(result, default=str))
        run.cfgs[stage.name], run.dirs[stage.name], run.results[stage.name] = cfg, folder, result
        run.last = stage.name
    return run


# ---------------------------------------------------------------------------------------------------- the set


def data_dir(claim: Claim, out: Path) -> Path | None:
    """The claim's corpus folder, written on first use (a marker file says it is complete)."""
    if claim.data is None:
        return None
    folder = out / "data" / claim.name
    if not (folder / "ablate_done").exists():
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / "build.log", "a") as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
            claim.data(folder)
        (folder / "ablate_done").write_text("ok\n")
    return folder


def result_path(out: Path, claim: str, arm: str, seed: int) -> Path:
    return out / "results" / claim / arm / f"seed{seed}.json"


def load_result(out: Path, claim: str, arm: str, seed: int, steps: dict) -> dict | None:
    """A stored result made with these stage sizes, else None (a result of another plan is redone)."""
    path = result_path(out, claim, arm, seed)
    if not path.exists():
        return None
    row = json.loads(path.read_text())
    return row if row.get("steps") == steps else None


def run_all(claims: list[Claim], plan: dict, out: Path, *, keep_runs: bool = False, say=print) -> dict:
    """Run every missing (claim, arm, seed), seed-major; -> {claim: {arm: [result rows by seed]}}."""
    done = ran = 0
    total = plan["seeds"] * sum(len(c.arms) for c in claims)
    t0 = time.perf_counter()
    for seed in range(plan["seeds"]):
        for claim in claims:
            steps = plan["steps"][claim.name]
            for arm in claim.arms:
                done += 1
                if load_result(out, claim.name, arm, seed, steps) is not None:
                    continue
                t_arm = time.perf_counter()
                run = run_arm(claim, arm, seed, steps, out)
                metrics = {k: float(v) for k, v in claim.measure(run).items()}
                sec = time.perf_counter() - t_arm
                row = {"claim": claim.name, "arm": arm, "seed": seed, "steps": steps, "metrics": metrics,
                       "curves": _curves(run, claim.curves), "seconds": round(sec, 1),
                       "load_avg": round(os.getloadavg()[0], 1)}
                path = result_path(out, claim.name, arm, seed)
                path.parent.mkdir(parents=True, exist_ok=True)
                write_atomic(path, json.dumps(row))
                ran += 1
                elapsed = time.perf_counter() - t0
                eta = elapsed / ran * (total - done)  # runs differ in cost: a rough figure
                say(f"[{done}/{total}] {claim.name} {arm} seed {seed}: "
                    + " ".join(f"{k}={v:.4g}" for k, v in metrics.items())
                    + f" ({sec:.0f} s, elapsed {elapsed / 60:.1f} min, eta ~{eta / 60:.0f} min, load {row['load_avg']})")
        if not keep_runs:  # a seed's runs are measured: free the disk (results stay)
            for claim in claims:
                shutil.rmtree(out / "runs" / claim.name / f"seed{seed}", ignore_errors=True)
    return collect(claims, plan, out)


def _curves(run: ArmRun, keys: list[str]) -> dict[str, list[list[float]]]:
    """The arm's final stage curves ([[step, value], ...] per key), kept with the result for the plots."""
    rows = run.rows()
    return {k: [[r["step"], r[k]] for r in rows if k in r and math.isfinite(r[k])] for k in keys}


def collect(claims: list[Claim], plan: dict, out: Path) -> dict:
    table = {}
    for claim in claims:
        steps = plan["steps"].get(claim.name)  # a claim outside the plan has no results of this plan
        table[claim.name] = {
            arm: [r for s in range(plan["seeds"]) if (r := load_result(out, claim.name, arm, s, steps)) is not None]
            for arm in claim.arms
        }
    return table


def read_plan(out: Path) -> dict | None:
    path = out / "plan.json"
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON ({e}); delete it to plan afresh") from None


def write_plan(out: Path, plan: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "plan.json", json.dumps(plan, indent=1))


def log_to(path: Path):
    """say(): print and append to the run's progress log."""
    def say(line: str) -> None:
        print(line, file=sys.__stdout__, flush=True)
        with open(path, "a") as f:
            f.write(line + "\n")

    return say
