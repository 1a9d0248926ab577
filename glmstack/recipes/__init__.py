"""Recipes: Python functions returning stage configs (`glmstack.recipes.<name>.<stage>() -> TrainConfig`).

A recipe module defines one function per stage it supports (pretrain, midtrain, ...); a recipe copies and
modifies a base rather than growing flags. `glmstack pretrain tiny` calls `glmstack.recipes.tiny.pretrain()`.

    cfg = load_config("tiny", "pretrain", ["optim.lr=3e-4"])     # recipe function + --set overrides
"""

from __future__ import annotations

import importlib
import pkgutil

from glmstack.config import ConfigError, apply_overrides
from glmstack.train.config import TrainConfig


def names() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(__path__))


def recipe_function(recipe: str, stage: str):
    """The function `glmstack.recipes.<recipe>.<stage>`, or a ConfigError listing what exists."""
    if recipe not in names():
        raise ConfigError(f"unknown recipe {recipe!r}; recipes: {', '.join(names())}")
    module = importlib.import_module(f"glmstack.recipes.{recipe}")
    fn = getattr(module, stage, None)
    if not callable(fn):
        raise ConfigError(f"recipe {recipe!r} has no {stage}() stage")
    return fn


def load_config(recipe: str, stage: str, overrides: list[str]) -> TrainConfig:
    """`glmstack.recipes.<recipe>.<stage>()` with `key=value` overrides applied (unknown keys list valid ones)."""
    cfg = recipe_function(recipe, stage)()
    if not isinstance(cfg, TrainConfig):
        raise ConfigError(f"recipe {recipe}.{stage}() returned {type(cfg).__name__}, expected TrainConfig")
    return apply_overrides(cfg, overrides)
