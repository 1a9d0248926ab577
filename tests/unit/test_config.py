"""The strict config helpers: unknown keys, wrong types, overrides, diffs."""

from dataclasses import dataclass, field

import pytest

from glmstack.config import ConfigError, apply_overrides, diff_fields, from_dict, to_dict


@dataclass(kw_only=True)
class Optim:
    lr: float = 1e-3  # peak learning rate
    betas: tuple[float, float] = (0.9, 0.95)


@dataclass(kw_only=True)
class Run:
    name: str = "x"
    steps: int = 10
    optim: Optim = field(default_factory=Optim)


def test_round_trip():
    cfg = Run(steps=3)
    assert from_dict(Run, to_dict(cfg)) == cfg


def test_unknown_key_lists_valid_keys():
    with pytest.raises(ConfigError, match=r"optim\.lrr.*valid keys: betas, lr"):
        from_dict(Run, {"optim": {"lrr": 1.0}})


def test_wrong_type_names_field():
    with pytest.raises(ConfigError, match="steps"):
        from_dict(Run, {"steps": "many"})


def test_overrides():
    cfg = apply_overrides(Run(), ["optim.lr=3e-4", "steps=7", "name=123"])
    assert cfg.optim.lr == 3e-4 and cfg.steps == 7 and cfg.name == "123"
    with pytest.raises(ConfigError, match="valid keys"):
        apply_overrides(Run(), ["optim.momentum=1"])


def test_diff_fields():
    assert diff_fields(Run(), apply_overrides(Run(), ["optim.lr=1"])) == ["optim.lr"]
