"""The RL dashboard: plots and a summary drawn from the stage's metrics.jsonl (nothing hooked into the loop).

Panels (docs/rl.md says how to read them): reward and held-out accuracy; response length; entropy; clip fraction
and the mismatch correction's masked fraction; mean |logp_train − logp_rollout|; the zero-variance group fraction;
rollout and train tokens/s; where a step's time goes (rollout / reward / train / weight sync / held-out eval). Train
time is what is left of the loop's step time (input tokens / the loop's tok_per_s) after the others.

    python -m glmstack.posttrain.rl.dashboard runs/speedrun/rl      # redraws runs/speedrun/rl/plots/rl_*.png
    python -m glmstack.posttrain.rl.dashboard --compare out.png grpo=runs/a/rl,runs/b/rl icepop=runs/c/rl,runs/d/rl
                                         # seeds of each setting: a mean ± std table (markdown) + mean curves
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from glmstack.train.metrics import read_metrics

PANELS = {
    "rl_reward": ("reward", "heldout_acc", "heldout_acc_sampled"),
    "rl_response_len": ("response_len",),
    "rl_entropy": ("entropy",),
    "rl_clip_and_mask": ("clip_frac", "mismatch_masked_frac", "masked_frac"),
    "rl_mismatch": ("mean_abs_logp_diff",),
    "rl_zero_variance": ("zero_var_frac",),
    "rl_throughput": ("rollout_tok_per_s", "train_tok_per_s"),
    "rl_time_split": ("time/rollout_s", "time/reward_s", "time/train_s", "time/sync_s", "time/eval_s"),
    "rl_loss": ("loss",),
}


def derived(rows: list[dict]) -> list[dict]:
    """Rows with the train time and train tokens/s added (see the module docstring)."""
    out = []
    for r in rows:
        r = dict(r)
        if r.get("tok_per_s") and "input_tokens" in r:
            step_s = r["input_tokens"] / r["tok_per_s"]
            other = sum(r.get(k, 0.0) for k in ("time/rollout_s", "time/reward_s", "time/sync_s", "time/eval_s"))
            r["time/step_s"], r["time/train_s"] = step_s, max(step_s - other, 1e-9)
            r["train_tok_per_s"] = r["input_tokens"] / r["time/train_s"]
        out.append(r)
    return out


def plot_dashboard(folder: str | Path) -> list[Path]:
    from glmstack.report import draw_curves

    folder = Path(folder)
    rows = derived(read_metrics(folder / "metrics.jsonl"))
    written = []
    for title, keys in PANELS.items():
        curves = []
        for k in keys:
            pts = [(r["step"], r[k]) for r in rows if k in r]
            if pts:
                xs, ys = zip(*pts)
                curves.append((k, list(xs), list(ys), ".-" if len(xs) < 30 else "-"))
        out = folder / "plots" / f"{title}.png"
        out.parent.mkdir(parents=True, exist_ok=True)
        if draw_curves(out, title, "step", "", curves):
            written.append(out)
    return written


def summary(folder: str | Path, result: dict) -> dict:
    """Start/end held-out accuracy, mean figures over the run, and the time split (fractions of the step)."""
    rows = derived(read_metrics(Path(folder) / "metrics.jsonl"))
    heldout = [r["heldout_acc"] for r in rows if "heldout_acc" in r]
    sampled = [r["heldout_acc_sampled"] for r in rows if "heldout_acc_sampled" in r]

    def mean(k):
        vals = [r[k] for r in rows if k in r]
        return sum(vals) / len(vals) if vals else None

    step_s = mean("time/step_s") or 0.0
    split = {k.split("/")[1]: (mean(f"time/{k.split('/')[1]}") or 0.0) / step_s if step_s else None
             for k in ("time/rollout_s", "time/reward_s", "time/train_s", "time/sync_s", "time/eval_s")}  # fmt: skip
    keys = ("reward", "response_len", "entropy", "clip_frac", "mismatch_masked_frac", "mean_abs_logp_diff",
            "zero_var_frac", "rollout_tok_per_s", "train_tok_per_s", "time/step_s")  # fmt: skip
    return {"heldout_start": heldout[0] if heldout else None, "heldout_end": result.get("heldout_acc"),
            "heldout_sampled_start": sampled[0] if sampled else None,
            "heldout_sampled_end": result.get("heldout_acc_sampled"),
            "steps": result.get("step"), "means": {k: mean(k) for k in keys}, "time_split": split}  # fmt: skip


def _mean_std(xs: list[float]) -> str:
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    m = sum(xs) / len(xs)
    sd = (sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5 if len(xs) > 1 else 0.0
    return f"{m:.3f} ± {sd:.3f}"


def _seed_mean(series: list[list[float]]) -> list[float]:
    n = min(map(len, series))
    return [sum(s[i] for s in series) / len(series) for i in range(n)]


def heldout_curve(folder: Path) -> list[tuple[int, float]]:
    """(step, greedy held-out accuracy): the evaluations during the run (taken before that step's update, so the
    step-1 point is the start model) and the final weights' score from rl_summary.json at the last step."""
    rows = read_metrics(folder / "metrics.jsonl")
    summ = json.loads((folder / "rl_summary.json").read_text())
    points = [(r["step"] - 1, r["heldout_acc"]) for r in rows if "heldout_acc" in r]
    return points + [(summ["steps"], summ["heldout_end"])]


def compare(groups: dict[str, list[str]], plot_path: str | None = None) -> str:
    """Settings × seeds -> a markdown table (mean ± std over seeds, std with Bessel's correction) and, with
    `plot_path`, each setting's seed-mean reward, grad-norm and held-out accuracy curves (<stem>_reward.png,
    <stem>_grad_norm.png, <stem>_heldout.png)."""
    cols = ("held-out start", "held-out end", "held-out end (sampled)", "reward (last 5)", "grad norm (mean)",
            "grad norm (max)", "mean abs dlogp", "masked frac", "min/seed")  # fmt: skip
    lines = ["| setting (seeds) | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    curves = []
    for name, folders in groups.items():
        per = {c: [] for c in cols}
        rewards, norms, heldout = [], [], []
        for f in folders:
            rows = derived(read_metrics(Path(f) / "metrics.jsonl"))
            summ = json.loads((Path(f) / "rl_summary.json").read_text())
            per["held-out start"].append(summ["heldout_start"])
            per["held-out end"].append(summ["heldout_end"])
            per["held-out end (sampled)"].append(summ.get("heldout_sampled_end"))
            with_reward = [r for r in rows if "reward" in r]  # PPO-style updates: one row per rollout batch has it
            per["reward (last 5)"].append(sum(r["reward"] for r in with_reward[-5:]) / len(with_reward[-5:]))
            per["grad norm (mean)"].append(sum(r["grad_norm"] for r in rows) / len(rows))
            per["grad norm (max)"].append(max(r["grad_norm"] for r in rows))
            per["mean abs dlogp"].append(summ["means"]["mean_abs_logp_diff"])
            per["masked frac"].append(summ["means"]["mismatch_masked_frac"])
            per["min/seed"].append(sum(r.get("time/step_s", 0.0) for r in rows) / 60)
            rewards.append([r["reward"] for r in with_reward])
            norms.append([r["grad_norm"] for r in rows])
            heldout.append(heldout_curve(Path(f)))
        lines.append(f"| {name} ({len(folders)}) | " + " | ".join(_mean_std(per[c]) for c in cols) + " |")
        steps = [s for s, _ in heldout[0]][: min(map(len, heldout))]
        curves.append((name, _seed_mean(rewards), _seed_mean(norms), (steps, _seed_mean([[a for _, a in h]
                                                                                       for h in heldout]))))  # fmt: skip
    if plot_path:
        from glmstack.report import draw_curves

        path = Path(plot_path)
        for i, what in ((1, "reward"), (2, "grad_norm")):
            draw_curves(path.with_name(f"{path.stem}_{what}{path.suffix}"), f"{what} (mean over seeds)", "step", "",
                        [(c[0], list(range(1, len(c[i]) + 1)), c[i], "-") for c in curves])  # fmt: skip
        draw_curves(path.with_name(f"{path.stem}_heldout{path.suffix}"), "held-out accuracy, greedy (mean over seeds)",
                    "step", "", [(c[0], c[3][0], c[3][1], ".-") for c in curves])  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1] == "--compare":
        groups = {a.split("=")[0]: a.split("=")[1].split(",") for a in sys.argv[3:]}
        print(compare(groups, sys.argv[2]))
    else:
        for p in plot_dashboard(sys.argv[1]):
            print(p)
