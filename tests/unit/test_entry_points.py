"""Issue 35: the RL variants are configurations of fewer entry points. `glmstack rl RECIPE` runs the stage the
recipe's config names (reasoning, agentic, distillation, VL), and the old command names stay as aliases."""

from __future__ import annotations

import json

import pytest

from glmstack.cli import main as glmstack
from glmstack.stage_cli import runner_for


@pytest.mark.parametrize(("command", "recipe", "section", "runner"), [
    ("rl", "rl_tiny", "rl", "run_rl"),
    ("rl", "agentic_tiny", "agentic", "run_agentic"),
    ("rl", "distill_tiny", "distill", "run_distill"),
    ("rl", "vl_tiny", "vl", "run_vl_rl"),
    ("agentic-rl", "agentic_tiny", "agentic", "run_agentic"),
    ("distill", "distill_tiny", "distill", "run_distill"),
    ("vl-rl", "vl_tiny", "vl", "run_vl_rl"),
    ("vl-train", "vl_tiny", "vl", "run_vl"),
    ("sft", "vl_tiny", "vl", "run_vl"),
    ("dpo", "dpo_tiny", "dpo", "run_dpo"),
    ("dpo", "dpo_speedrun", "dpo", "run_dpo"),
])  # fmt: skip
def test_a_command_runs_the_stage_its_recipes_config_names(command, recipe, section, runner, capsys):
    from glmstack.recipes import load_config
    from glmstack.stage_cli import recipe_stage

    assert glmstack([command, recipe, "--print-config"]) == 0
    assert section in json.loads(capsys.readouterr().out)
    cfg = load_config(recipe, recipe_stage(recipe, command), [])
    assert runner_for(cfg).__name__ == runner


def test_stage_flag_picks_the_recipe_function(capsys):
    from glmstack.recipes import load_config

    assert glmstack(["vl-train", "vl_tiny", "--stage", "align", "--print-config"]) == 0
    assert json.loads(capsys.readouterr().out)["stage"] == "align"
    assert runner_for(load_config("vl_tiny", "vit", [])).__name__ == "run_vit"
    assert glmstack(["rl", "rl_tiny", "--stage", "nope"]) == 2
    assert "has no nope() stage" in capsys.readouterr().err


def test_vl_stages_refuse_several_ranks(monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert glmstack(["vl-train", "vl_tiny", "--stage", "align", "--set", "steps=1"]) == 2
    assert "one process" in capsys.readouterr().err
