"""The one plotter: curves into a PNG, for a stage's plots (train/metrics.py), the RL and agentic dashboards and the
run report (glmstack/report.py), so a stage and a run look the same.

Its own module, below all of them: with it in report.py, train/metrics.py (a training module) imported the run
report (a command) and the report imported train/metrics.py back (issue 35).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def draw_curves(path: Path, title: str, xlabel: str, ylabel: str, curves, boundaries=(), logy=False) -> bool:
    """Draw `curves` [(label, xs, ys, style)] into `path`; False (nothing drawn) when every curve is empty."""
    curves = [c for c in curves if c[1]]
    if not curves:
        return False
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=100)
    for label, xs, ys, style in curves:
        ax.plot(xs, ys, style, label=label, markersize=3)
    for x, name in boundaries:
        ax.axvline(x, color="grey", linestyle=":", linewidth=1)
        ax.text(x, ax.get_ylim()[1], f" {name}", va="top", fontsize=8, color="grey")
    if logy:
        ax.set_yscale("log")
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True
