"""The agentic RL seeds table: the plots are the one RL dashboard's (posttrain/rl/dashboard.py, agentic panels).

    python -m glmstack.posttrain.agentic.dashboard runs/speedrun/agentic     # redraws plots/agentic_*.png (rl's)
    python -m glmstack.posttrain.agentic.dashboard --compare clean=RUN_A/agentic,RUN_B/agentic faults=RUN_C/agentic \\
        [--plot out.png] [--key heldout_success]
        # per setting over its seeds: greedy held-out success (mean ± std) at every evaluated step, without and
        # with injected tool failures, the training reward of steps 1-8 (a markdown table); --plot: the mean of
        # --key (default: the training reward) per step
"""

from __future__ import annotations

import sys
from pathlib import Path

from glmstack.posttrain.rl.dashboard import mean_std, plot_dashboard
from glmstack.train.metrics import read_metrics

COLUMNS = {"heldout_success": "held-out", "heldout_faults_success": "with failures",
           "heldout_faults_retry_frac": "retried after a failure"}  # fmt: skip


def compare(settings: dict[str, list[Path]]) -> str:
    """A markdown table: per setting (its seeds' folders), greedy held-out success after each evaluated number of
    updates (the row logged after an evaluation at step s scored the weights after s updates; the end from
    agentic_summary.json), without and with injected tool failures, and with failures the share of episodes with a
    failed call that called again (runs that log it); and the mean training reward of steps 1-8."""
    import json

    evals: dict[str, dict[tuple[str, int], list[float]]] = {}
    early: dict[str, list[float]] = {}
    for name, folders in settings.items():
        cols = evals.setdefault(name, {})
        for f in folders:
            rows = read_metrics(f / "metrics.jsonl")
            points = [(r["step"] - 1, r) for r in rows if "heldout_success" in r]
            summary = f / "agentic_summary.json"
            if summary.exists():
                points.append((max(r["step"] for r in rows), json.loads(summary.read_text())))
            for updates, r in points:
                for key in (k for k in COLUMNS if k in r):
                    cols.setdefault((key, updates), []).append(float(r[key]))
            rewards = [r["reward"] for r in rows if r["step"] <= 8]
            early.setdefault(name, []).append(sum(rewards) / max(len(rewards), 1))
    keys = sorted({k for cols in evals.values() for k in cols}, key=lambda k: (list(COLUMNS).index(k[0]), k[1]))
    lines = ["| setting | seeds | " + " | ".join(f"{COLUMNS[k]} @{u}" for k, u in keys) + " | reward, steps 1-8 |",
             "|---|---|" + "---|" * (len(keys) + 1)]  # fmt: skip
    for name, folders in settings.items():
        cells = [mean_std(evals[name].get(k, [])) for k in keys] + [mean_std(early[name])]
        lines.append(f"| {name} | {len(folders)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_compare(settings: dict[str, list[Path]], out: Path, key: str = "reward") -> bool:
    """Mean over seeds of `key` per step, one curve per setting, into `out`. A held-out key (COLUMNS) is plotted
    against the number of updates, as the table counts them, with the end from agentic_summary.json."""
    import json

    from glmstack.train.plots import draw_curves

    curves = []
    for name, folders in settings.items():
        per_step: dict[int, list[float]] = {}
        for f in folders:
            rows = read_metrics(f / "metrics.jsonl")
            shift = 1 if key in COLUMNS else 0  # an evaluation is logged on the row after the updates it scored
            for r in rows:
                if key in r:
                    per_step.setdefault(r["step"] - shift, []).append(r[key])
            summary = f / "agentic_summary.json"
            if shift and summary.exists() and key in (end := json.loads(summary.read_text())):
                per_step.setdefault(max(r["step"] for r in rows), []).append(end[key])
        steps = sorted(per_step)
        curves.append(
            (f"{name} ({len(folders)} seeds)", steps, [sum(per_step[s]) / len(per_step[s]) for s in steps], ".-")
        )
    return draw_curves(out, f"{key}, mean over seeds", "updates" if key in COLUMNS else "step", key, curves)


if __name__ == "__main__":
    if sys.argv[1] == "--compare":
        args = sys.argv[2:]
        out = Path(args.pop(args.index("--plot") + 1)) if "--plot" in args else None
        key = args.pop(args.index("--key") + 1) if "--key" in args else "reward"
        args = [a for a in args if a not in ("--plot", "--key")]
        settings = {k: [Path(p) for p in v.split(",")] for k, v in (a.split("=", 1) for a in args)}
        print(compare(settings))
        if out is not None:
            plot_compare(settings, out, key)
    else:
        for p in plot_dashboard(sys.argv[1]):
            print(p)
