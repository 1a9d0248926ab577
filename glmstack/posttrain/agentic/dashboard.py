"""The agentic RL dashboard: plots from the stage's metrics.jsonl (nothing hooked into the loop).

    python -m glmstack.posttrain.agentic.dashboard runs/speedrun/agentic     # redraws plots/agentic_*.png
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


if __name__ == "__main__":
    for p in plot_dashboard(sys.argv[1]):
        print(p)
