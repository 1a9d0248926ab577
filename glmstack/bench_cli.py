"""`glmstack bench [NAME [ARGS...]]`: list the benchmarks in bench/ or run one.

Benchmarks live beside the package in a source checkout (bench/*.py, each printing a ratio against a reference
measured in the same run), not in the package: an installed wheel has no bench/, so this command works only from a
git clone (`pip install -e .`). It only finds and starts them, so `glmstack bench decode --repeats 9`
equals `python bench/decode.py --repeats 9`.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parents[1] / "bench"


def _summary(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def available() -> dict[str, Path]:
    return {p.stem: p for p in sorted(BENCH_DIR.glob("*.py")) if not p.name.startswith("_")}


def main(argv: list[str]) -> int:
    benches = available() if BENCH_DIR.is_dir() else {}
    if not benches:
        print(f"glmstack bench: no bench/ folder next to the package ({BENCH_DIR}): the benchmarks ship with the "
              f"source checkout, not the wheel; clone the repository and `pip install -e .` there", file=sys.stderr)
        return 2
    if not argv or argv[0] in ("-h", "--help"):
        width = max(map(len, benches))
        rows = "\n".join(f"  {name:<{width}}  {_summary(p)}" for name, p in benches.items())
        print(f"usage: glmstack bench NAME [ARGS...]   (NAME --help for its options)\n\nbenchmarks:\n{rows}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in benches:
        print(f"glmstack bench: unknown benchmark {name!r}; one of: {', '.join(benches)}", file=sys.stderr)
        return 2
    return subprocess.call([sys.executable, str(benches[name]), *rest])
