"""Metrics: one log line per step, metrics.jsonl, optional TensorBoard and Weights & Biases (`log.tensorboard`,
`log.wandb=offline|online`: the same rows), and PNG plots drawn from the jsonl.

Everything the loop measures goes through `Metrics.log(step, dict)`; plots are made afterwards from
metrics.jsonl alone (not from hooks), so `python -m glmstack.train.metrics runs/tiny/pretrain` redraws them.
Only rank 0 writes.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from glmstack.atomic import write_atomic

# What a log line shows, in order: (key, format).
LINE_FIELDS = (
    ("loss", "{:.4f}"),
    ("lr", "{:.2e}"),
    ("grad_norm", "{:.3f}"),
    ("tok_per_s", "{:,.0f}"),
    ("moe/max_over_mean", "{:.2f}"),
    ("val_loss", "{:.4f}"),
    ("mfu", "{:.1%}"),
)
# Plot panels: title -> metric keys (prefix match for per-layer series).
PLOTS = {
    "loss": ("loss", "lm_loss", "val_loss"),
    "lr": ("lr",),
    "mtp": ("mtp_loss",),
    "router_load": ("moe/max_over_mean/",),
    "router_entropy": ("moe/entropy/",),
    "grad_norm": ("grad_norm",),
    # DPO (posttrain/dpo): TRL's names; panels without series are not drawn
    "dpo_rewards": ("rewards/chosen", "rewards/rejected", "rewards/margins"),
    "dpo_accuracy": ("rewards/accuracies",),
    "dpo_logps": ("logps/chosen", "logps/rejected", "sft_nll"),
}


def format_line(step: int, total: int, row: dict, eta_s: float | None = None) -> str:
    """`step   12/100 | loss 3.2100 | lr 2.50e-04 | ...` (fixed order, absent fields skipped)."""
    parts = [f"step {step:>6}/{total}"]
    parts += [f"{k} {fmt.format(row[k])}" for k, fmt in LINE_FIELDS if k in row]
    if eta_s is not None:
        parts.append(f"eta {int(eta_s) // 60}m{int(eta_s) % 60:02d}s")
    return " | ".join(parts)


class Metrics:
    """metrics.jsonl appender (+ TensorBoard when asked); no-op off rank 0."""

    def __init__(self, folder: str | Path, *, enabled: bool = True, tensorboard: bool = False, wandb: str = "off",
                 name: str = "", config: dict | None = None):  # fmt: skip
        self.folder, self.enabled = Path(folder), enabled
        self.tb = None
        self.wandb = _wandb_run(self.folder, wandb, name, config) if enabled and wandb != "off" else None
        if enabled and tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as e:
                raise RuntimeError(
                    "log.tensorboard=true needs the tensorboard package (pip install tensorboard)"
                ) from e

            self.tb = SummaryWriter(str(self.folder / "tensorboard"))

    def log(self, step: int, row: dict) -> None:
        if not self.enabled:
            return
        row = {"step": step, **{k: v for k, v in row.items() if _finite_number(v)}}
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / "metrics.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        if self.tb is not None:
            for k, v in row.items():
                self.tb.add_scalar(k, v, step)
        if self.wandb is not None:
            self.wandb.log({k: v for k, v in row.items() if k != "step"}, step=step)

    def truncate_after(self, step: int) -> None:
        """Drop rows logged after `step` (a resumed run re-logs them; the file stays one row per step)."""
        path = self.folder / "metrics.jsonl"
        if self.enabled and path.exists():
            rows = [r for r in read_metrics(path) if r.get("step", -1) <= step]
            write_atomic(path, "".join(json.dumps(r) + "\n" for r in rows))

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            import wandb

            self.wandb.finish()
            wandb.teardown()  # waits for wandb-core: finish() returns before the offline file is written out


def _wandb_run(folder: Path, mode: str, name: str, config: dict | None):
    """A Weights & Biases run under folder/wandb/ (mode offline: written locally, no network; `wandb sync
    folder/wandb/offline-run-*` uploads it later). Each process is one W&B run named `run/stage`; a resumed stage
    is a second run of the same name and group (wandb 0.31 writes nothing offline for a run given a fixed id)."""
    try:
        import wandb
    except ImportError:
        from glmstack.config import ConfigError

        raise ConfigError("log.wandb needs the wandb package (pip install 'glmstack[tracking]')") from None
    folder.mkdir(parents=True, exist_ok=True)
    settings = wandb.Settings(console="off", silent=True, x_disable_stats=True, disable_git=True, save_code=False)
    return wandb.init(mode=mode, dir=str(folder), project="glmstack", name=name or folder.name, group=name or None,
                      config=config or {}, settings=settings)


def _finite_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def read_metrics(path: str | Path) -> list[dict]:
    """One dict per line of a metrics.jsonl ([] if there is none). The one reader of the file (resume, plots, the
    run report): a line that is not JSON, e.g. half written when a run was killed mid-write, is skipped."""
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def plot(folder: str | Path) -> list[Path]:
    """One PNG per PLOTS panel under folder/plots/, from folder/metrics.jsonl; returns the files written. Drawn by
    the one plotter (glmstack.train.plots.draw_curves), so a stage and a run look the same."""
    from glmstack.train.plots import draw_curves

    folder = Path(folder)
    rows = read_metrics(folder / "metrics.jsonl")
    written = []
    for title, keys in PLOTS.items():
        series = sorted(
            {k for r in rows for k in r if any(k == p or (p.endswith("/") and k.startswith(p)) for p in keys)}
        )
        curves = []
        for k in series:
            xs, ys = zip(*[(r.get("step", i), r[k]) for i, r in enumerate(rows) if k in r])
            curves.append((k, list(xs), list(ys), ".-" if len(xs) < 30 else "-"))
        out = folder / "plots" / f"{title}.png"
        if curves:
            out.parent.mkdir(exist_ok=True)
        if draw_curves(out, title, "step", "", curves):
            written.append(out)
    return written


if __name__ == "__main__":
    for p in plot(sys.argv[1]):
        print(p)
