"""Repo-level code documents: the files of one repository in import-dependency order, with path markers.

GLM-4.5 §2.3 mid-trains on "concatenated code files from the same repository to learn cross-file dependency".
The order follows DeepSeek-Coder (README "Data Creation", issue #43): repeatedly take the file with the fewest
unplaced dependencies (Kahn's sort on an acyclic graph; a cycle is broken at its least-blocked file), ties
broken by a seeded draw over the path-sorted candidates so the result is reproducible. Python imports come
from `ast` (relative imports resolved against the file's package); other languages get no edges.

Format (research spec §7.4; Qwen2.5-Coder's marker names):
    <|repo_name|>{name}
    <|file_sep|>{path}
    {content}
    ...
"""

from __future__ import annotations

import ast
import random
from pathlib import PurePosixPath

REPO_NAME, FILE_SEP = "<|repo_name|>", "<|file_sep|>"


def module_name(path: str) -> str:
    """'pkg/sub/mod.py' -> 'pkg.sub.mod'; 'pkg/__init__.py' -> 'pkg'."""
    parts = list(PurePosixPath(path).with_suffix("").parts)
    if parts and parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def python_imports(path: str, text: str) -> set[str]:
    """Absolute dotted names this file imports (relative imports resolved; unparsable files import nothing)."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError):
        return set()
    package = module_name(path).split(".")
    if not path.endswith("__init__.py"):
        package = package[:-1]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            out.add(mod)
            out.update(f"{mod}.{a.name}" if mod else a.name for a in node.names)
    return out


def dependencies(files: dict[str, str], root_name: str = "") -> dict[str, set[str]]:
    """path -> set of repo paths it imports. Modules are matched with and without the repo-name prefix."""
    by_module: dict[str, str] = {}
    for p in files:
        if p.endswith(".py"):
            by_module[module_name(p)] = p
            if root_name:
                by_module[f"{root_name}.{module_name(p)}".rstrip(".")] = p
    deps: dict[str, set[str]] = {p: set() for p in files}
    for p, text in files.items():
        if p.endswith(".py"):
            mods = python_imports(f"{root_name}/{p}" if root_name else p, text)
            deps[p] = {by_module[m] for m in mods if m in by_module and by_module[m] != p}
    return deps


def dependency_order(deps: dict[str, set[str]], seed: int = 0) -> list[str]:
    """Fewest-unplaced-dependencies-first order with a seeded tie-break (DeepSeek-Coder)."""
    rng = random.Random(seed)
    remaining = set(deps)
    blocked = {p: len(deps[p]) for p in deps}
    dependents: dict[str, set[str]] = {p: set() for p in deps}
    for p, ds in deps.items():
        for d in ds:
            dependents[d].add(p)
    order = []
    while remaining:
        least = min(blocked[p] for p in remaining)
        p = rng.choice(sorted(q for q in remaining if blocked[q] == least))
        order.append(p)
        remaining.discard(p)
        for w in dependents[p] & remaining:
            blocked[w] -= 1
    return order


def repo_document(name: str, files: dict[str, str], seed: int = 0) -> str:
    """One document for a repository: name line, then each file as a path marker line and its content."""
    order = dependency_order(dependencies(files, name), seed)
    parts = [f"{REPO_NAME}{name}\n"]
    parts += [f"{FILE_SEP}{p}\n{files[p]}" + ("" if files[p].endswith("\n") else "\n") for p in order]
    return "".join(parts)
