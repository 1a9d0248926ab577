"""The agentic RL dashboard: plots from the stage's metrics.jsonl (nothing hooked into the loop).

python -m glmstack.posttrain.agentic.dashboard runs/speedrun/agentic     # redraws plots/agentic_*.png
python -m glmstack.posttrain.agentic.dashboard --compare clean=runs/a/agentic,runs/b/agentic faults=runs/c/agentic
    # per setting over its seeds: held-out success (mean ± std) at the start and the end, without and with
    # injected tool failures, and the training reward of the first steps (a markdown table)
"""

from __future__ import annotations

import sys
from pathlib import Path

from glmstack.train.metrics import read_metrics

PANELS = {
    "agentic_success": ("success", "reward", "heldout_success", "heldout_faults_success"),
    "agentic_episode": ("turns", "tool_calls", "malformed_frac", "loop_frac", "truncated_frac"),
    "agentic_staleness": ("staleness_mean", "staleness_max", "rollout/stale", "rollout/env_error", "rollout/padded"),
    "agentic_throughput": ("traj_per_s",),
    "agentic_time": ("time/wait_s", "time/sync_s", "time/eval_s"),
    "agentic_loss": ("loss", "masked_frac", "grad_norm"),
}


def plot_dashboard(folder: str | Path) -> list[Path]:
    from glmstack.report import draw_curves

    folder = Path(folder)
    rows = read_metrics(folder / "metrics.jsonl")
    written = []
    for title, keys in PANELS.items():
        curves = []
        for k in keys:
            pts = [(r["step"], r[k]) for r in rows if k in r and r[k] is not None]
            if pts:
                xs, ys = zip(*pts)
                curves.append((k, list(xs), list(ys), ".-"))
        out = folder / "plots" / f"{title}.png"
        out.parent.mkdir(parents=True, exist_ok=True)
        if draw_curves(out, title, "step", "", curves):
            written.append(out)
    return written


def _mean_std(xs: list[float]) -> str:
    if not xs:
        return "-"
    m = sum(xs) / len(xs)
    sd = (sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5 if len(xs) > 1 else 0.0
    return f"{m:.3f} ± {sd:.3f}"


def compare(settings: dict[str, list[Path]]) -> str:
    """A markdown table: per setting (its seeds' folders), held-out success at the start (the first evaluated row)
    and the end (agentic_summary.json), clean and with injected failures; mean reward of the first 8 steps."""
    import json

    header = ("| setting | seeds | held-out start | held-out end | with failures start | with failures end "
              "| reward, steps 1-8 |")  # fmt: skip
    lines = [header, "|---|---|---|---|---|---|---|"]
    for name, folders in settings.items():
        cols: dict[str, list[float]] = {k: [] for k in ("s", "e", "fs", "fe", "r")}
        for f in folders:
            rows = read_metrics(f / "metrics.jsonl")
            first = next((r for r in rows if "heldout_success" in r), {})
            summary = (
                json.loads((f / "agentic_summary.json").read_text()) if (f / "agentic_summary.json").exists() else {}
            )
            for key, src, col in (
                ("heldout_success", first, "s"),
                ("heldout_success", summary, "e"),
                ("heldout_faults_success", first, "fs"),
                ("heldout_faults_success", summary, "fe"),
            ):
                if key in src:
                    cols[col].append(float(src[key]))
            early = [r["reward"] for r in rows if r["step"] <= 8]
            if early:
                cols["r"].append(sum(early) / len(early))
        lines.append(
            f"| {name} | {len(folders)} | " + " | ".join(_mean_std(cols[k]) for k in ("s", "e", "fs", "fe", "r")) + " |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1] == "--compare":
        print(compare({k: [Path(p) for p in v.split(",")] for k, v in (a.split("=", 1) for a in sys.argv[2:])}))
    else:
        for p in plot_dashboard(sys.argv[1]):
            print(p)
