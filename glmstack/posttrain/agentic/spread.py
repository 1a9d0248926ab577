"""Two settings' training curves against each other's seed spread (issue 18: "async with τ = 0 and K = 1 reproduces
the synchronous run ... curves within 3 seeds' spread").

    python -m glmstack.posttrain.agentic.spread sync=RUN_S0/agentic,RUN_S1/agentic,RUN_S2/agentic \\
        async=RUN_A0/agentic,RUN_A1/agentic,RUN_A2/agentic [--key reward] [--window 4] [--plot out.png]

Per setting and per window of steps: each seed's mean of `key`, then the setting's mean, std and [min, max] over
seeds (a markdown table); per step, whether one setting's seed mean lies inside the other's [min, max] band (the
fraction of steps, both ways). --plot: each setting's mean per step with its seeds' min-max band shaded.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from glmstack.train.metrics import read_metrics


def load(folders: list[Path], key: str) -> list[dict[int, float]]:
    """Per seed: step -> value of `key`."""
    return [{r["step"]: float(r[key]) for r in read_metrics(f / "metrics.jsonl") if r.get(key) is not None}
            for f in folders]  # fmt: skip


def band(seeds: list[dict[int, float]], steps: list[int]) -> tuple[list[float], list[float], list[float]]:
    """Per step: mean, min and max over the seeds."""
    cols = [[s[t] for s in seeds] for t in steps]
    return [statistics.fmean(c) for c in cols], [min(c) for c in cols], [max(c) for c in cols]


def table(settings: dict[str, list[dict[int, float]]], steps: list[int], window: int) -> str:
    spans = [steps[i : i + window] for i in range(0, len(steps), window)] + [steps]
    head = " | ".join(f"steps {s[0]}–{s[-1]}" for s in spans)
    lines = [f"| setting | seeds | {head} |", "|---|---|" + "---|" * len(spans)]
    for name, seeds in settings.items():
        cells = []
        for span in spans:
            per_seed = [statistics.fmean(s[t] for t in span) for s in seeds]
            sd = statistics.stdev(per_seed) if len(per_seed) > 1 else 0.0
            cells.append(f"{statistics.fmean(per_seed):.3f} ± {sd:.3f} [{min(per_seed):.3f}, {max(per_seed):.3f}]")
        lines.append(f"| {name} | {len(seeds)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def inside(a: list[dict[int, float]], b: list[dict[int, float]], steps: list[int]) -> float:
    """The fraction of steps at which a's seed mean lies within b's seeds' [min, max]."""
    mean, _, _ = band(a, steps)
    _, lo, hi = band(b, steps)
    return sum(lo_ <= m <= hi_ for m, lo_, hi_ in zip(mean, lo, hi)) / len(steps)


def plot(settings: dict[str, list[dict[int, float]]], steps: list[int], key: str, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=100)
    for name, seeds in settings.items():
        mean, lo, hi = band(seeds, steps)
        (line,) = ax.plot(steps, mean, ".-", label=f"{name}: mean of {len(seeds)} seeds", markersize=4)
        ax.fill_between(steps, lo, hi, color=line.get_color(), alpha=0.2, label=f"{name}: seeds' min–max")
    ax.set(title=f"{key} per step", xlabel="step", ylabel=key)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("settings", nargs=2, help="NAME=FOLDER,FOLDER,... (stage folders holding metrics.jsonl)")
    ap.add_argument("--key", default="reward")
    ap.add_argument("--window", type=int, default=4)
    ap.add_argument("--plot", type=Path)
    args = ap.parse_args(argv)
    settings = {}
    for arg in args.settings:
        name, _, folders = arg.partition("=")
        settings[name] = load([Path(f) for f in folders.split(",")], args.key)
    steps = sorted(set.intersection(*(set(s) for seeds in settings.values() for s in seeds)))
    if not steps:
        ap.error(f"no step has {args.key!r} in every run")
    print(table(settings, steps, args.window))
    (a, sa), (b, sb) = settings.items()
    print(f"\nsteps where {a}'s mean is inside {b}'s seeds' [min, max]: {inside(sa, sb, steps):.0%}; "
          f"{b}'s inside {a}'s: {inside(sb, sa, steps):.0%} ({len(steps)} steps)")  # fmt: skip
    if args.plot:
        plot(settings, steps, args.key, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
