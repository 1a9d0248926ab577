"""`glmstack expert-iteration`'s recipe and table: each expert trains on one set, the merged model on all of them
for the experts' steps together, the table shows every merged seed against the expert, and bad input is one line."""

import pytest

from glmstack.config import ConfigError
from glmstack.posttrain.expert_iteration import EXPERTS, expert_set, main, table
from glmstack.recipes import load_config


def test_merged_model_gets_every_experts_sets_and_steps():
    experts = [load_config("sft_speedrun", f"sft_{name}", []) for name in EXPERTS]
    merged = load_config("sft_speedrun", "sft_merged", [])
    assert [expert_set(c) for c in experts] == ["compare", "tools", "chat"]
    assert merged.sft.data == [f"synthetic:{expert_set(c)}" for c in experts]
    assert merged.steps == sum(c.steps for c in experts)
    assert {c.init_from for c in experts} == {merged.init_from} == {"speedrun/sft/model"}  # one base for all
    # the speedrun's own SFT stage is not the experts' business
    sft = load_config("sft_speedrun", "sft", [])
    assert sft.steps == 300 and sft.sft.data == [f"synthetic:{s}" for s in ("arithmetic", "tools", "chat", "compare")]


def test_an_expert_on_several_sets_is_an_error():
    cfg = load_config("sft_speedrun", "sft_merged", [])
    with pytest.raises(ConfigError, match="expert_merged: an expert trains on one synthetic:<set>"):
        expert_set(cfg)


def test_table_has_a_column_per_seed_and_the_smallest_kept_fraction():
    scores = {
        "tools": {"expert": 0.5, "merged": {0: 0.55, 1: 0.45}, "kept": {0: 1.1, 1: 0.9}},
        "arithmetic": {"expert": 0.0, "merged": {0: 0.05, 1: 0.0}, "kept": {0: None, 1: None}},
    }
    lines = table(scores).splitlines()
    assert lines[0] == ("| held-out set | expert | merged, seed 0 (kept) | merged, seed 1 (kept) | kept, mean | "
                        "kept, min |")  # fmt: skip
    assert lines[1].count("|") == lines[0].count("|")
    assert lines[2] == "| tools | 50.0% | 55.0% (110%) | 45.0% (90%) | 100% | 90% |"
    assert lines[3] == "| arithmetic | 0.0% | 5.0% (-) | 0.0% (-) | - | - |"  # an expert at 0 keeps nothing


def test_bad_seeds_and_unknown_recipe_are_one_line(capsys):
    assert main(["sft_speedrun", "--seeds", "0,x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--seeds '0,x': expected integers" in err
    assert main(["no_such_recipe"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown recipe 'no_such_recipe'" in err
