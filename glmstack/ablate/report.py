"""The ablation report: ablations.md (one row per check: effect, 95% interval over seeds, verdict), one plot per
claim (training curves of each arm, mean over seeds; each checked metric per seed) and results.json (raw).

Drawn only from the stored results (results/<claim>/<arm>/seed<k>.json), so `glmstack ablate --report` redraws it
at any time, also from a partial run.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from glmstack.ablate.stats import t_interval, verdict
from glmstack.atomic import write_atomic


def check_row(claim, check, arms: dict[str, list[dict]]) -> dict:
    """Effect and verdict of one check from the per-seed results (paired by seed)."""
    def values(arm):
        return {r["seed"]: r["metrics"][check.metric] for r in arms.get(arm, []) if check.metric in r["metrics"]}

    t = values(check.treatment)
    if check.kind == "above":
        seeds = sorted(t)
        diffs = [t[s] for s in seeds]
        c_mean = math.nan
    else:
        c = values(check.control)
        seeds = sorted(set(t) & set(c))
        diffs = [t[s] - c[s] for s in seeds]
        c_mean = float(np.mean([c[s] for s in seeds])) if seeds else math.nan
    if not diffs:
        return {"claim": claim.name, "metric": check.metric, "n": 0, "verdict": "not run"}
    mean, low, high = t_interval(diffs)
    return {"claim": claim.name, "source": claim.source, "metric": check.metric, "treatment": check.treatment,
            "control": check.control, "kind": check.kind, "better": check.better, "margin": check.margin,
            "says": check.says, "n": len(seeds), "treatment_mean": float(np.mean([t[s] for s in seeds])),
            "control_mean": c_mean, "effect": mean, "low": low, "high": high,
            "verdict": verdict(check.kind, check.better, low, high, check.margin)}


def _num(x: float) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if math.isinf(x):
        return "∞" if x > 0 else "−∞"
    return f"{x:.3g}" if abs(x) < 100 else f"{x:.0f}"


def table_md(rows: list[dict]) -> str:
    lines = ["| claim | metric | arms | treatment | control | effect | 95% interval | n | verdict |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["n"] == 0:
            lines.append(f"| {r['claim']} | {r['metric']} | | | | | | 0 | not run |")
            continue
        arms = f"{r['treatment']} vs {r['control']}" if r["control"] else f"{r['treatment']} (> {r['margin']:g})"
        rule = {"better": f"{r['better']} is better", "no_worse": f"margin {r['margin']:g}",
                "above": "value"}[r["kind"]]
        effect = _num(r["effect"]) if r["kind"] != "above" else f"{_num(r['effect'])} (value)"
        lines.append(f"| {r['claim']} | {r['metric']} ({rule}) | {arms} | {_num(r['treatment_mean'])} | "
                     f"{_num(r['control_mean'])} | {effect} | [{_num(r['low'])}, {_num(r['high'])}] | {r['n']} | "
                     f"**{r['verdict']}** |")
    return "\n".join(lines)


def plot_claim(claim, arms: dict[str, list[dict]], path: Path) -> bool:
    """Left: each curve key per arm (mean over seeds); right: each checked metric per seed and arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not any(arms.values()):
        return False
    n_checks = len(claim.checks)
    fig, axes = plt.subplots(1, 1 + n_checks, figsize=(4 * (1 + n_checks), 3.2), dpi=100, squeeze=False)
    ax = axes[0][0]
    key = claim.curves[0]
    color = {arm: f"C{i}" for i, arm in enumerate(claim.arms)}  # one colour per arm in every panel
    for arm, results in arms.items():
        curves = [r["curves"].get(key, []) for r in results if r["curves"].get(key)]
        if curves:
            n = min(len(c) for c in curves)
            xs = [p[0] for p in curves[0][:n]]
            ax.plot(xs, np.mean([[p[1] for p in c[:n]] for c in curves], 0), label=arm, color=color[arm])
    ax.set(title=f"{claim.name}: {key}", xlabel="step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    for i, check in enumerate(claim.checks, 1):
        ax = axes[0][i]
        shown = [a for a in (check.treatment, check.control) if a]
        for j, arm in enumerate(shown):
            vals = [r["metrics"][check.metric] for r in arms.get(arm, []) if check.metric in r["metrics"]]
            ax.scatter([j] * len(vals), vals, s=18, color=color[arm])
            if vals:
                ax.hlines(np.mean(vals), j - 0.2, j + 0.2, color="black")
        ax.set_xticks(range(len(shown)), shown, fontsize=8)
        ax.set(title=f"{check.metric} ({check.better} better)", xlim=(-0.5, len(shown) - 0.5))
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def write(claims, table: dict, plan: dict, out: Path, command: str) -> Path:
    """ablations.md, plots/<claim>.png and results.json under `out`; -> the markdown file."""
    rows = [check_row(c, k, table[c.name]) for c in claims for k in c.checks]
    (out / "plots").mkdir(parents=True, exist_ok=True)
    plots = [c.name for c in claims if plot_claim(c, table[c.name], out / "plots" / f"{c.name}.png")]
    seconds = sum(r["seconds"] for arms in table.values() for rs in arms.values() for r in rs)
    loads = [r["load_avg"] for arms in table.values() for rs in arms.values() for r in rs]
    load = f"{min(loads, default=0):.1f}–{max(loads, default=0):.1f}"
    lines = [f"Command: `{command}`", "",
             (f"Plan: scale {plan['scale']} of each claim's steps, {plan['seeds']} seeds; {seconds / 60:.1f} min of "
              f"runs; load average {load} during the runs."), "",
             table_md(rows), "", "Claims and set-ups:", ""]
    for c in claims:
        steps = ", ".join(f"{k} {v}" for k, v in plan["steps"].get(c.name, {}).items()) or "not in this plan"
        lines.append(f"- **{c.name}** ({c.source}): {c.statement}. {c.setup}. Steps: {steps}.")
    lines += ["", "Plots: " + ", ".join(f"[{p}](plots/{p}.png)" for p in plots), ""]
    path = out / "ablations.md"
    write_atomic(path, "\n".join(lines))
    raw = {"command": command, "plan": plan, "checks": rows, "results": table}
    write_atomic(out / "results.json", json.dumps(raw, indent=1, default=float))
    return path
