"""Recipes: Python functions returning stage configs (`glmstack.recipes.<name>.<stage>() -> TrainConfig`).

A recipe module defines one function per stage it supports (pretrain, midtrain, ...); a recipe copies and
modifies a base rather than growing flags. `glmstack pretrain tiny` calls `glmstack.recipes.tiny.pretrain()`.
"""

from __future__ import annotations

import importlib
import pkgutil

from glmstack.config import ConfigError


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
