"""What the Makefile installs and what glmstack imports: `installed_by_make()` for `make install`,
`installed_by_make("$(BIN)/.speedrun-installed")` for `make speedrun`'s subset (distribution names, read from the
Makefile's `pip install` lines and pyproject.toml's extras), and `unguarded_imports()`, the third-party modules
glmstack imports outside an ImportError guard (tests/unit/test_dependencies.py, tests/integration/test_speedrun.py)."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(req: str) -> str:
    return norm(re.split(r"[\s<>=!~;\[]", req.strip(), maxsplit=1)[0])


def installed_by_make(target: str | None = None) -> set[str]:
    """Distribution names the Makefile's `pip install` lines name: core dependencies, the extras they name (a
    `glmstack[...]` inside an extra expanded), the packages they name; only `target`'s recipe lines if given."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    names = {_requirement_name(r) for r in project["dependencies"]}
    for line in _recipe_lines(target):
        if "pip install" not in line:
            continue
        args = line.split("pip install", 1)[1].split("#")[0].split()
        for arg in args:
            if m := re.fullmatch(r'"?\.\[([\w,-]+)\]"?', arg):
                names |= _extras(extras, m.group(1).split(","))
            elif not arg.startswith(("-", "$", '"', ".")):
                names.add(_requirement_name(arg))
    return names


def _recipe_lines(target: str | None) -> list[str]:
    """The Makefile's lines, or only those of `target`'s recipe (the tab-indented lines after its rule)."""
    lines = (ROOT / "Makefile").read_text().splitlines()
    if target is None:
        return lines
    start = next(i for i, x in enumerate(lines) if x.startswith(f"{target}:")) + 1
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("\t")), len(lines))
    return lines[start:end]


def _extras(extras: dict, wanted: list[str]) -> set[str]:
    names = set()
    for extra in wanted:
        assert extra in extras, f"the Makefile installs extra {extra!r}, which pyproject.toml lacks"
        for req in extras[extra]:
            if m := re.fullmatch(r"glmstack\[([\w,-]+)\]", req.strip()):
                names |= _extras(extras, m.group(1).split(","))
            else:
                names.add(_requirement_name(req))
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
