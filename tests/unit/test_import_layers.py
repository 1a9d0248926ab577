"""glmstack's import graph has no cycles and its layers import one way (issue 35).

The graph is read from the source (ast), not by importing, so it sees every `import` statement:

- Cycles count EVERY import, at module level and inside functions (a cycle hidden inside a function is still two
  modules that cannot be read or changed apart). Imports under `if TYPE_CHECKING:` and modules named by a string
  at run time (cli.py's command table, recipe / environment / reward registries: `importlib.import_module`) are
  not edges.
- Layers, lowest first (ARCHITECTURE.md "Layers"): base (config, errors, atomic, splits, tokenizer, chat, sandbox) <-
  model (model, optim, data) <- engine (inference) <- trainer (train) <- stages (posttrain, multimodal, eval,
  serve) <- commands (recipes, report, speedrun, ablate, cli, stage_cli, bench_cli, and every package's
  `cli.py`). A module may import its own layer and the layers below. Every import counts here too, except those
  inside a top-level `main` / `*_main` function: that function is the module's command (what cli.py's table
  calls), so it is command-layer code and may name a recipe or the stage runner.

    python tests/unit/test_import_layers.py     # prints the cycles and wrong-way imports, if any
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "glmstack"

LAYERS = (
    ("base", ("glmstack", "glmstack.config", "glmstack.errors", "glmstack.atomic", "glmstack.tokenizer",
              "glmstack.chat", "glmstack.sandbox", "glmstack.splits")),
    ("model", ("glmstack.model", "glmstack.optim", "glmstack.data")),
    ("engine", ("glmstack.inference",)),
    ("trainer", ("glmstack.train",)),
    ("stages", ("glmstack.posttrain", "glmstack.multimodal", "glmstack.eval", "glmstack.serve")),
    ("commands", ("glmstack.recipes", "glmstack.report", "glmstack.speedrun", "glmstack.ablate", "glmstack.cli",
                  "glmstack.stage_cli", "glmstack.bench_cli")),
)  # fmt: skip
COMMANDS = len(LAYERS) - 1


def modules() -> dict[str, Path]:
    """Dotted module name -> file, for every .py under glmstack/ (a package is its __init__.py)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, known: dict) -> list[str]:
    """The glmstack modules an import statement loads (`from pkg import sub` names the submodule)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            parts = module.split(".")[: len(module.split(".")) - (node.level - (1 if is_package else 0))]
            base = ".".join(parts + ([node.module] if node.module else []))
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
    out = []
    for name in names:
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name.startswith("glmstack"):
            out.append(name)
    return out


def _imports(tree: ast.Module):
    """(import node, inside a command entry point) for every import outside `if TYPE_CHECKING:`."""
    def walk(nodes, in_main: bool):
        for n in nodes:
            if isinstance(n, (ast.Import, ast.ImportFrom)):
                yield n, in_main
            elif isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test):
                continue
            else:
                yield from walk(ast.iter_child_nodes(n), in_main)

    for top in tree.body:
        entry = isinstance(top, ast.FunctionDef) and (top.name == "main" or top.name.endswith("_main"))
        yield from walk([top], entry)


def graph() -> dict[str, dict[str, bool]]:
    """module -> {imported module: True when every import of it is inside the module's command entry point}."""
    known = modules()
    edges: dict[str, dict[str, bool]] = {}
    for module, path in known.items():
        out = edges.setdefault(module, {})
        for node, in_main in _imports(ast.parse(path.read_text(), str(path))):
            for target in _targets(node, module, path.name == "__init__.py", known):
                if target != module:
                    out[target] = out.get(target, True) and in_main
    return edges


def cycles(edges: dict[str, dict[str, bool]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def layer_of(module: str) -> int:
    """Index into LAYERS; a package's cli.py is a command whatever its package."""
    if module.rpartition(".")[2] == "cli":
        return COMMANDS
    best, rank = -1, None
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best:
                best, rank = len(p), i
    if rank is None:
        raise AssertionError(f"{module} is in no layer: add its package to LAYERS")
    return rank


def wrong_way(edges: dict[str, dict[str, bool]]) -> list[str]:
    """`a -> b` lines where a imports a module of a higher layer (outside a.main)."""
    bad = []
    for a, targets in sorted(edges.items()):
        for b, only_in_main in sorted(targets.items()):
            src = COMMANDS if only_in_main else layer_of(a)
            if layer_of(b) > src:
                bad.append(f"{a} ({LAYERS[layer_of(a)][0]}) -> {b} ({LAYERS[layer_of(b)][0]})")
    return bad


def describe(edges, component: list[str]) -> str:
    inner = [f"{a} -> {b}" for a in component for b in edges[a] if b in component]
    return "cycle: " + "; ".join(inner)


def test_no_import_cycles():
    edges = graph()
    found = [describe(edges, c) for c in cycles(edges)]
    assert not found, "import cycles (move the shared piece into its own module):\n" + "\n".join(found)


def test_layers_import_one_way():
    bad = wrong_way(graph())
    assert not bad, "imports against the layer order (ARCHITECTURE.md, Layers):\n" + "\n".join(bad)


def test_every_module_has_a_layer():
    for module in modules():
        layer_of(module)


def test_the_checker_sees_function_level_cycles_and_layers(tmp_path, monkeypatch):
    """The checker itself: a cycle through a function-level import and a model -> engine import are caught."""
    pkg = tmp_path / "glmstack"
    for rel, text in {
        "__init__.py": "",
        "model/__init__.py": "",
        "model/a.py": "def f():\n    from glmstack.model import b\n",
        "model/b.py": "from glmstack.model.a import f\n",
        "model/c.py": "from glmstack.inference import engine\n",
        "model/d.py": "def main():\n    from glmstack.recipes import x\n",
        "inference/__init__.py": "",
        "inference/engine.py": "",
        "recipes/__init__.py": "",
        "recipes/x.py": "",
    }.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", pkg)
    edges = graph()
    assert cycles(edges) == [["glmstack.model.a", "glmstack.model.b"]]
    assert wrong_way(edges) == ["glmstack.model.c (model) -> glmstack.inference.engine (engine)"]


if __name__ == "__main__":
    g = graph()
    for c in cycles(g):
        print(describe(g, c))
    for line in wrong_way(g):
        print("wrong way:", line)
