"""What a claim of `glmstack ablate` is: arms (recipe stages with overrides), how an arm is measured, and checks.

A claim file (glmstack/ablate/claims/<name>.py) defines one `CLAIM = Claim(...)`. Every arm is a list of stages
of the ONE training loop, each a recipe function (`glmstack.recipes.<recipe>.<fn>()`) with `--set`-style
overrides, so an arm is exactly what a user could run with `glmstack pretrain <recipe> --set ...`. Stages named
alike in two arms are the same run (per seed), trained once: GLM-5's DSA claim starts three arms from one dense
checkpoint that way.

    Claim(name="muon", source="GLM-4.5 §2.4", statement="Muon beats AdamW at equal tokens",
          arms={"muon": [stage(optim__muon=True)], "adamw": [stage(optim__muon=False)]},
          measure=final_val_loss, checks=[Check(metric="val_loss", treatment="muon", control="adamw")])
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from glmstack.config import ConfigError


@dataclass(kw_only=True)
class Stage:
    """One training stage of an arm: a recipe function with overrides; its steps are scaled by the budget."""

    name: str  # run folder name; arms sharing a stage name share the run (per seed)
    recipe: str = "ablate"  # glmstack/recipes/<recipe>.py
    fn: str = "pretrain"  # the recipe function (pretrain, midtrain, rl, ...)
    overrides: dict[str, Any] = field(default_factory=dict)  # dotted TrainConfig keys -> values (as --set)
    steps: int = 200  # optimizer steps at scale 1 (the budget multiplies this)
    cost: float = 1.0  # wall time of one step relative to one step of the ablate recipe (for the budget)
    warmup_frac: float = 0.1  # lr warm-up as a fraction of the (scaled) steps; 0 = none
    init_from: str = ""  # name of an earlier stage of the same arm whose checkpoint this one starts from
    kind: Literal["train", "rl"] = "train"  # rl = glmstack.posttrain.rl.stage.run_rl (its config is an RLConfig)

    def set_args(self, steps: int, data: Path | None = None) -> list[str]:
        """The `key=value` overrides of this stage at `steps` steps (values JSON-encoded, as --set parses them);
        "{data}" in a string value is the claim's corpus folder."""
        sized = {"steps": steps, "schedule.total_steps": steps,
                 "schedule.warmup_steps": max(1, round(self.warmup_frac * steps)) if self.warmup_frac else 0}
        sets = [f"{k}={json.dumps(v)}" for k, v in (sized | self.overrides).items()]
        return [s.replace("{data}", str(data)) for s in sets] if data is not None else sets


@dataclass(kw_only=True)
class Check:
    """One row of the results table: a metric compared between two arms (or of one arm against a threshold)."""

    metric: str  # a key of the measure function's dict
    treatment: str  # the arm the paper recommends
    control: str = ""  # the arm it is compared with ("" for kind=above)
    better: Literal["lower", "higher"] = "lower"
    kind: Literal["better", "no_worse", "above"] = "better"  # see glmstack/ablate/stats.py
    margin: float = 0.0  # no_worse: tolerated loss; better: smallest useful gain; above: the threshold
    says: str = ""  # the paper's words for this row


@dataclass(kw_only=True)
class Claim:
    name: str  # CLI name (the file name)
    source: str  # paper and section
    statement: str  # the claim in one line
    arms: dict[str, list[Stage]]  # arm name -> its stages in order
    measure: Callable[..., dict[str, float]]  # measure(run: ArmRun) -> metrics of one (arm, seed)
    checks: list[Check]
    setup: str = ""  # what the scale-down keeps and changes, for the report
    curves: list[str] = field(default_factory=lambda: ["loss"])  # metrics.jsonl keys drawn per arm in the plot
    data: Callable[[Path], object] | None = None  # writes the claim's corpus into a folder; overrides say "{data}"
    default: bool = True  # in the set `glmstack ablate` runs when no claim is named (False: only when named)

    def __post_init__(self):
        for c in self.checks:
            for arm in (c.treatment, c.control):
                if arm and arm not in self.arms:
                    raise ConfigError(f"claim {self.name}: check {c.metric} names unknown arm {arm!r}")
        self.stage_table()

    def stage_table(self) -> dict[str, Stage]:
        """Stage name -> Stage; arms that name a stage alike must define it alike (they share its run)."""
        table: dict[str, Stage] = {}
        for arm, stages in self.arms.items():
            for s in stages:
                if table.setdefault(s.name, s) != s:
                    raise ConfigError(f"claim {self.name}: arm {arm} defines stage {s.name!r} differently")
        return table

    def steps(self) -> int:
        """Optimizer steps of one seed of all arms at scale 1 (shared stages counted once)."""
        return sum(s.steps for s in self.stage_table().values())


def with_base_recipe(claim: Claim, recipe: str) -> Claim:
    """The claim with its `ablate`-recipe stages on another base recipe (e.g. ablate_gpu, the larger version)."""
    arms = {a: [dataclasses.replace(s, recipe=recipe) if s.recipe == "ablate" else s for s in stages]
            for a, stages in claim.arms.items()}
    return dataclasses.replace(claim, arms=arms)


def names() -> list[str]:
    from glmstack.ablate import claims

    return sorted(m.name for m in pkgutil.iter_modules(claims.__path__) if not m.name.startswith("_"))


def default_names() -> list[str]:
    """The claims `glmstack ablate` runs when none is named: issue 20's ten (the GLM-4.5 / GLM-5 reports')."""
    return [n for n in names() if load(n).default]


def load(name: str) -> Claim:
    if name not in names():
        raise ConfigError(f"unknown claim {name!r}; claims: {', '.join(names())}")
    return importlib.import_module(f"glmstack.ablate.claims.{name}").CLAIM
