"""`glmstack pretrain|midtrain`: bad input gives one clear line (valid keys, unknown recipe), --print-config."""

import json

from glmstack.cli import main


def test_unknown_override_lists_valid_keys(capsys):
    assert main(["pretrain", "tiny", "--set", "optim.lrr=1", "--print-config"]) == 2
    out = capsys.readouterr().err
    assert "unknown override key 'optim.lrr'" in out and "optim.lr" in out and "schedule.warmup_steps" in out


def test_unknown_recipe(capsys):
    assert main(["midtrain", "nope"]) == 2
    assert "unknown recipe 'nope'; recipes:" in capsys.readouterr().err


def test_print_config_applies_overrides(capsys):
    assert main(["midtrain", "tiny", "--set", "optim.lr=3e-4", "--print-config"]) == 0
    cfg = json.loads(capsys.readouterr().out)
    assert cfg["optim"]["lr"] == 3e-4 and cfg["stage"] == "midtrain" and cfg["rope_theta"] == 1e6
