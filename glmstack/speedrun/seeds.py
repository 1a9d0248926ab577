"""The report cards of several speedrun folders (seeds) as one table: each metric and stage as mean ± std (n-1) over the
runs, numbers only ("not installed" and missing cells are left out of the mean and counted).

    python -m glmstack.speedrun.seeds runs/s0 runs/s1 runs/s2 [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


def load_cards(folders: list[str]) -> list[dict]:
    cards = []
    for f in folders:
        path = Path(f) / "summary.json"
        if not path.exists():
            raise SystemExit(f"{path}: no summary.json (a finished speedrun folder is needed)")
        cards.append(json.loads(path.read_text())["card"])
    return cards


def seed_table(cards: list[dict]) -> dict[str, dict[str, dict]]:
    """{metric: {stage: {"mean", "std", "n", "values"}}} over the cards (stages and metrics in the first card's
    order)."""
    stages = list(dict.fromkeys(s for c in cards for s in c))
    metrics = list(dict.fromkeys(m for c in cards for col in c.values() for m in col))
    out: dict[str, dict[str, dict]] = {}
    for m in metrics:
        for s in stages:
            values = [c[s][m] for c in cards if isinstance(c.get(s, {}).get(m), (int, float))]
            if values:
                std = statistics.stdev(values) if len(values) > 1 else 0.0
                out.setdefault(m, {})[s] = {"mean": statistics.fmean(values), "std": std, "n": len(values),
                                            "values": values}  # fmt: skip
    return out


def markdown(table: dict, digits: int = 3) -> str:
    stages = list(dict.fromkeys(s for row in table.values() for s in row))
    lines = ["| metric | " + " | ".join(stages) + " |", "|---" * (len(stages) + 1) + "|"]
    for m, row in table.items():
        cells = [f"{row[s]['mean']:.{digits}g} ± {row[s]['std']:.2g}" if s in row else "-" for s in stages]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m glmstack.speedrun.seeds", description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="speedrun folders (each with summary.json)")
    ap.add_argument("--json", help="also write the table as JSON here")
    args = ap.parse_args(argv)
    table = seed_table(load_cards(args.runs))
    print(markdown(table))
    if args.json:
        Path(args.json).write_text(json.dumps(table, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
