"""The one RL dashboard (every RL path: reasoning, agentic, distillation, VL): plots and a summary drawn from the
stage's metrics.jsonl (nothing hooked into the loop). A panel is drawn when the run logged any of its figures.

Panels (docs/rl.md and docs/agentic.md say how to read them): reward and held-out accuracy; response length;
entropy; clip fraction and the mismatch correction's masked fraction; mean |logp_train − logp_rollout|; with routing
replay, the fraction of tokens (and of token-layer pairs) the trainer's own top-k routes differently; the
zero-variance group fraction; rollout and train tokens/s; where a step's time goes (rollout / reward / train /
weight sync / held-out eval); staleness in trainer steps; and the agentic episodes' panels (success, turns and
failures, retries after a failed call, throughput, waiting). Train time is what is left of the loop's step time
(input tokens / the loop's tok_per_s) after the others.

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
    "rl_reward": ("reward", "heldout_acc", "heldout_acc_sampled", "heldout_reward"),
    "rl_response_len": ("response_len",),
    "rl_entropy": ("entropy",),
    "rl_clip_and_mask": ("clip_frac", "mismatch_masked_frac", "masked_frac"),
    "rl_mismatch": ("mean_abs_logp_diff", "logp_diff_frac"),
    "rl_routing": ("routing_diff_frac", "routing_layer_diff_frac"),  # routing replay (replay.py): record / replay
    "rl_zero_variance": ("zero_var_frac",),
    "rl_throughput": ("rollout_tok_per_s", "train_tok_per_s"),
    "rl_time_split": ("time/rollout_s", "time/reward_s", "time/train_s", "time/sync_s", "time/eval_s"),
    "rl_loss": ("loss",),
    "rl_mtp": ("mtp_accept_len", "spec_equals_greedy", "mtp_loss"),  # the MTP layer through RL (rl.mtp_weight)
    "rl_staleness": ("staleness_mean", "staleness_max", "weight_version"),
    # PPO's critic and KL (rl.loss=ppo, ppo.py)
    "rl_ppo_value": ("value_loss", "explained_variance", "vf_clip_frac"),
    "rl_ppo_kl": ("kl", "ppo_kl", "values_mean", "returns_mean"),
    # agentic RL (posttrain/agentic): episodes, failures, the asynchronous runner
    "agentic_success": ("success", "reward", "heldout_success", "heldout_faults_success"),
    "agentic_episode": ("turns", "tool_calls", "malformed_frac", "loop_frac", "truncated_frac"),
    "agentic_retry": ("retry_frac", "heldout_faults_retry_frac"),  # after a failed call: called again
    "agentic_staleness": ("rollout/stale", "rollout/env_error", "rollout/padded"),
    "agentic_throughput": ("traj_per_s",),
    "agentic_time": ("time/wait_s", "time/sync_s", "time/eval_s"),
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
    from glmstack.train.plots import draw_curves

    folder = Path(folder)
    rows = derived(read_metrics(folder / "metrics.jsonl"))
    written = []
    for title, keys in PANELS.items():
        curves = []
        for k in keys:
            pts = [(r["step"], r[k]) for r in rows if r.get(k) is not None]
            if pts:
                xs, ys = zip(*pts)
                curves.append((k, list(xs), list(ys), ".-" if len(xs) < 30 else "-"))
        out = folder / "plots" / f"{title}.png"
        out.parent.mkdir(parents=True, exist_ok=True)
        if draw_curves(out, title, "step", "", curves):
            written.append(out)
    return written


def bitwise_every_step(rows: list[dict]) -> bool:
    """Every step's rollout log-probs equal the trainer's bit for bit (logp_diff_frac 0 on every row that has it)."""
    diff = [r["logp_diff_frac"] for r in rows if "logp_diff_frac" in r]
    return bool(diff) and max(diff) == 0.0


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
            "logp_diff_frac", "routing_diff_frac", "routing_layer_diff_frac", "zero_var_frac", "rollout_tok_per_s",
            "train_tok_per_s", "time/step_s")  # fmt: skip
    return {"logp_bitwise_every_step": bitwise_every_step(rows),  # rl.true_on_policy's claim, checked
            "heldout_start": heldout[0] if heldout else None, "heldout_end": result.get("heldout_acc"),
            "heldout_sampled_start": sampled[0] if sampled else None,
            "heldout_sampled_end": result.get("heldout_acc_sampled"),
            "heldout_reward_start": next((r["heldout_reward"] for r in rows if "heldout_reward" in r), None),
            "heldout_reward_end": result.get("heldout_reward"),  # rl.rewards on held-out replies (e.g. an RM's)
            "mtp_accept_len_start": next((r["mtp_accept_len"] for r in rows if "mtp_accept_len" in r), None),
            "mtp_accept_len_end": result.get("mtp_accept_len"),
            "steps": result.get("step"), "means": {k: mean(k) for k in keys}, "time_split": split}  # fmt: skip


def mean_std(xs: list[float]) -> str:
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    m = sum(xs) / len(xs)
    sd = (sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5 if len(xs) > 1 else 0.0
    return f"{m:.3f} ± {sd:.3f}"


def _seed_mean(series: list[list[float]]) -> list[float]:
    n = min(map(len, series))
    return [sum(s[i] for s in series) / len(series) for i in range(n)]


def heldout_curve(folder: Path, key: str = "heldout_acc", upto: int | None = None) -> list[tuple[int, float]]:
    """(updates done, held-out accuracy): the evaluations during the run (taken before that step's update, so the
    step-1 row scores the start model) and, for a finished run, the final weights' score from rl_summary.json;
    `upto` keeps the points at most that many updates in (an unfinished run compared at a common step)."""
    points = [(r["step"] - 1, r[key]) for r in read_metrics(folder / "metrics.jsonl") if key in r]
    summary = folder / "rl_summary.json"
    if summary.exists():
        summ = json.loads(summary.read_text())
        end = summ["heldout_end" if key == "heldout_acc" else "heldout_sampled_end"]
        points = [p for p in points if p[0] < summ["steps"]] + [(summ["steps"], end)]
    return [p for p in points if upto is None or p[0] <= upto]


def compare(groups: dict[str, list[str]], plot_path: str | None = None, upto: int | None = None) -> str:
    """Settings × seeds -> a markdown table (mean ± std over seeds, std with Bessel's correction) and, with
    `plot_path`, each setting's seed-mean reward, grad-norm and held-out accuracy curves (<stem>_reward.png,
    <stem>_grad_norm.png, <stem>_heldout.png). `upto`: only the first `upto` steps (held-out "end" = the evaluation
    after `upto` updates), so runs still going can be compared at a step they have all reached."""
    cols = ("held-out start", "held-out end", "held-out end (sampled)", "held-out min", "reward (last 5)",
            "grad norm (mean)", "grad norm (max)", "mean abs dlogp", "masked frac", "min/seed")  # fmt: skip
    lines = ["| setting (seeds) | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    curves = []
    for name, folders in groups.items():
        per = {c: [] for c in cols}
        rewards, norms, heldout = [], [], []
        for f in folders:
            rows = [r for r in derived(read_metrics(Path(f) / "metrics.jsonl")) if upto is None or r["step"] <= upto]
            curve, sampled = heldout_curve(Path(f), upto=upto), heldout_curve(Path(f), "heldout_acc_sampled", upto)
            per["held-out start"].append(curve[0][1])
            per["held-out end"].append(curve[-1][1])
            per["held-out end (sampled)"].append(sampled[-1][1] if sampled else None)
            per["held-out min"].append(min(a for _, a in curve))
            with_reward = [r for r in rows if "reward" in r]  # PPO-style updates: one row per rollout batch has it
            per["reward (last 5)"].append(sum(r["reward"] for r in with_reward[-5:]) / len(with_reward[-5:]))
            per["grad norm (mean)"].append(sum(r["grad_norm"] for r in rows) / len(rows))
            per["grad norm (max)"].append(max(r["grad_norm"] for r in rows))
            for col, key in (("mean abs dlogp", "mean_abs_logp_diff"), ("masked frac", "mismatch_masked_frac")):
                per[col].append(sum(r.get(key, 0.0) for r in rows) / len(rows))
            per["min/seed"].append(sum(r.get("time/step_s", 0.0) for r in rows) / 60)
            rewards.append([r["reward"] for r in with_reward])
            norms.append([r["grad_norm"] for r in rows])
            heldout.append(curve)
        lines.append(f"| {name} ({len(folders)}) | " + " | ".join(mean_std(per[c]) for c in cols) + " |")
        steps = [s for s, _ in heldout[0]][: min(map(len, heldout))]
        curves.append((name, _seed_mean(rewards), _seed_mean(norms), (steps, _seed_mean([[a for _, a in h]
                                                                                       for h in heldout]))))  # fmt: skip
    if plot_path:
        from glmstack.train.plots import draw_curves

        path = Path(plot_path)
        for i, what in ((1, "reward"), (2, "grad_norm")):
            draw_curves(path.with_name(f"{path.stem}_{what}{path.suffix}"), f"{what} (mean over seeds)", "step", "",
                        [(c[0], list(range(1, len(c[i]) + 1)), c[i], "-") for c in curves])  # fmt: skip
        draw_curves(path.with_name(f"{path.stem}_heldout{path.suffix}"), "held-out accuracy, greedy (mean over seeds)",
                    "step", "", [(c[0], c[3][0], c[3][1], ".-") for c in curves])  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1] == "--compare":  # --compare OUT.png [--upto N] name=folder,folder ...
        args, upto = sys.argv[3:], None
        if args and args[0] == "--upto":
            upto, args = int(args[1]), args[2:]
        groups = {a.split("=")[0]: a.split("=")[1].split(",") for a in args}
        print(compare(groups, sys.argv[2], upto))
    else:
        for p in plot_dashboard(sys.argv[1]):
            print(p)
