"""The run report: report.md and plots drawn from the stages' metrics.jsonl files and a summary of figures.

Plots come from the metrics files (read by glmstack.train.metrics.read_metrics, the one reader, which skips a
half-written last line), never from hooks in the training code, so a report can be redrawn for any run folder at
any time:

    python -m glmstack.report runs/speedrun            # rewrites runs/speedrun/report.md and plots/

`write_report(run_dir, summary)` is what `glmstack speedrun` calls. `summary` (also saved as summary.json) holds
what the metrics files do not: `figures` (name -> number, deterministic for one seed), `timings` (stage ->
seconds, excluded from comparisons), `samples` (prompt/completion pairs), `perplexity_by_position`
(curve name -> list of NLL per position), `position_marks` ([position, label] lines on that plot), `speculative` (accepted-length histogram and mean), `data_steps`
(build name -> [step, documents in, documents out] rows), `config`, `missing` (parts that did not run).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from glmstack.train.metrics import read_metrics
from glmstack.train.plots import draw_curves

STAGES = ("pretrain", "midtrain", "sft", "rl")  # drawn on one step axis, in this order
LAYER_BALANCE = "moe/max_over_mean/"  # the loop's per-MoE-layer max/mean expert load (glmstack/train/balance.py)
BALANCE_KEYS = ("moe/max_over_mean",)  # worst layer, when per-layer values are absent


def _series(rows: list[dict], key: str, offset: int = 0, smooth: float = 0.0) -> tuple[list[int], list[float]]:
    """(steps, values) of `key`; `smooth` > 0 applies an exponential moving average (per-step losses are noisy)."""
    pts = [(r.get("step", i) + offset, r[key]) for i, r in enumerate(rows) if isinstance(r.get(key), (int, float))]
    ys, avg = [], None
    for _, v in pts:
        avg = v if avg is None or not smooth else smooth * avg + (1 - smooth) * v
        ys.append(float(avg))
    return [p[0] for p in pts], ys


def _smoothing(n_points: int) -> float:
    """EMA factor averaging over ~1/10 of a curve's points (none for short curves)."""
    window = n_points / 10
    return 1 - 1 / window if window > 1 else 0.0


def imbalance(row: dict) -> float | None:
    """Expert load imbalance of one metrics row: max load / mean load averaged over layers (1.0 = even)."""
    per_layer = [v for k, v in row.items() if k.startswith(LAYER_BALANCE)]
    if per_layer:
        return sum(per_layer) / len(per_layer)
    for key in BALANCE_KEYS:
        if isinstance(row.get(key), (int, float)):
            return float(row[key])
    load = row.get("expert_load")
    if not isinstance(load, list) or not load:
        return None
    layers = load if isinstance(load[0], list) else [load]
    ratios = [max(l) / (sum(l) / len(l)) for l in layers if l and sum(l) > 0]
    return sum(ratios) / len(ratios) if ratios else None


def _stage_rows(run_dir: Path) -> dict[str, list[dict]]:
    return {s: read_metrics(run_dir / s / "metrics.jsonl") for s in STAGES}


def plot_training(run_dir: Path, plots: Path) -> list[str]:
    """Losses, learning rate and expert balance over pre-training then mid-training (one step axis)."""
    rows, offset, boundaries = _stage_rows(run_dir), 0, []
    loss, lr, bal = [], [], []
    for stage, rs in rows.items():
        if not rs:
            continue
        if offset:
            boundaries.append((offset, stage))
        ema = _smoothing(len(rs))
        for key, style, smooth in (("lm_loss", "-", ema), ("mtp_loss", "--", ema), ("val_loss", "o-", 0.0)):
            xs, ys = _series(rs, key, offset, smooth)
            loss.append((f"{stage} {key}" + (" (EMA)" if smooth else ""), xs, ys, style))
        lr.append((stage, *_series(rs, "lr", offset), "-"))
        bal_rows = [{"step": r.get("step", i), "imbalance": imbalance(r)} for i, r in enumerate(rs)]
        bal.append((f"{stage} (EMA)", *_series(bal_rows, "imbalance", offset, _smoothing(len(rs))), "-"))
        offset += max((r.get("step", 0) for r in rs), default=0)
    drawn = []
    if draw_curves(plots / "losses.png", "Loss", "step", "cross-entropy (nats)", loss, boundaries):
        drawn.append("losses.png")
    if draw_curves(plots / "lr.png", "Learning rate", "step", "lr", lr, boundaries):
        drawn.append("lr.png")
    if draw_curves(plots / "expert_load.png", "Expert load balance (max / mean, 1 = even)", "step", "imbalance", bal,
             boundaries):
        drawn.append("expert_load.png")
    return drawn


def plot_perplexity(curves: dict[str, list[float]], plots: Path, marks=()) -> list[str]:
    """NLL by token position per checkpoint, smoothed over windows so tiny evals stay readable."""
    lines = []
    for name, nll in curves.items():
        w = max(1, len(nll) // 32)
        xs = list(range(0, len(nll) - w + 1, w))
        ys = [sum(nll[x : x + w]) / w for x in xs]
        lines.append((name, xs, ys, "-"))
    ok = draw_curves(plots / "perplexity_by_position.png", "Loss by token position (held-out code)", "position",
               "NLL (nats)", lines, marks)
    return ["perplexity_by_position.png"] if ok else []


def plot_accepted(spec: dict, plots: Path) -> list[str]:
    """Histogram of tokens accepted per MTP speculative step (1 = draft rejected, only the verified token)."""
    hist = {int(k): v for k, v in (spec.get("histogram") or {}).items()}
    if not hist:
        return []
    fig, ax = plt.subplots(figsize=(5, 3.2), dpi=100)
    ks = sorted(hist)
    ax.bar(ks, [hist[k] for k in ks], color="tab:green")
    ax.set(title=f"MTP speculative decoding: mean accepted length {spec.get('mean_accepted', float('nan')):.2f}",
           xlabel="tokens per verify step", ylabel="share of verify steps", xticks=ks)
    ax.title.set_fontsize(10)
    fig.tight_layout()
    fig.savefig(plots / "accepted_length.png")
    plt.close(fig)
    return ["accepted_length.png"]


def _fmt(v) -> str:
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.4g}"
    return str(v)


def card_table(card: dict[str, dict]) -> list[str]:
    """The report card as markdown lines: one row per metric, one column per model."""
    names = list(card)
    metrics = list(dict.fromkeys(m for col in card.values() for m in col))
    out = ["## Report card", "", "| metric | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    out += [f"| {m} | " + " | ".join(_fmt(card[n].get(m, "-")) for n in names) + " |" for m in metrics]
    return out


def decode_line(spec: dict) -> str:
    """The decoding speeds, and with the cost model's figures (glmstack.inference.spec_cost) why MTP drafting is or
    is not faster: a round costs `round_over_plain` plain steps and emits `mean_accepted` tokens."""
    k, plain, mtp = spec.get("draft_k"), spec["tokens_per_s_plain"], spec["tokens_per_s_mtp"]
    line = (f"Greedy decoding of the held-out prompts: {plain:.0f} tokens/s plain, {mtp:.0f} tokens/s with MTP "
            f"drafting (k = {k})")
    if "speedup_bound" not in spec:  # a summary written before the cost model was measured
        return line + "."
    tau, rounds, bound = spec["mean_accepted"], spec["round_over_plain"], spec["speedup_bound"]
    ms = spec["phase_ms"]
    verify, draft = ms[f"verify_{k + 1}"] / ms["plain"], ms["mtp_step"] / ms["plain"]
    verdict = "cannot be faster than plain decoding" if bound < 1 else f"can be at most {bound:.2f}x as fast"
    return (f"Greedy decoding of {spec['batch']} held-out prompts as one batch (batch size {spec['batch']}, "
            f"{spec['new_tokens']} new tokens each): {plain:.0f} tokens/s plain, {mtp:.0f} tokens/s with MTP drafting "
            f"(k = {k}), {mtp / plain:.2f}x. A draft-verify round emitted {tau:.2f} tokens on average (mean accepted "
            f"length) and cost {rounds:.2f} plain decode steps (a verify over {k + 1} positions {verify:.2f}, {k} MTP "
            f"steps {draft:.2f} each; timed at this batch size), so the speed-up is at most {tau:.2f} / {rounds:.2f} = {bound:.2f}x: at this "
            f"size MTP {verdict}. Drafting pays where a round costs fewer plain steps than it emits tokens: in a large "
            "model a verify over k + 1 positions costs about one plain step (memory-bound) and an MTP step is one "
            "layer of dozens." + _gap(mtp / plain, bound))


def _gap(measured: float, bound: float) -> str:
    if measured >= bound:
        return ""
    return (f" The measured {measured:.2f}x is below the bound by what the bound leaves out (the catch-up over the "
            "accepted positions, the cache rewinds, the accept checks) and by timing noise on a shared machine.")


def _markdown(summary: dict, drawn: list[str]) -> str:
    out = [f"# {summary.get('title', 'glmstack run report')}", ""]
    if summary.get("intro"):
        out += [summary["intro"], ""]
    out += ["## Figures", "", "| figure | value |", "|---|---|"]
    out += [f"| {k} | {_fmt(v)} |" for k, v in summary.get("figures", {}).items()]
    if summary.get("card"):
        out += ["", *card_table(summary["card"])]
    if summary.get("data_steps"):
        names = list(summary["data_steps"])
        out += ["", "## Data pipeline", "", "Documents in and out of each step of each build.", "",
                "| step | " + " | ".join(f"{n} in → out" for n in names) + " |", "|---" * (len(names) + 1) + "|"]
        rows = {}
        for n in names:
            for step, n_in, n_out in summary["data_steps"][n]:
                rows.setdefault(step, {})[n] = f"{n_in} → {n_out}"
        out += [f"| {step} | " + " | ".join(r.get(n, "") for n in names) + " |" for step, r in rows.items()]
    if summary.get("timings"):
        out += ["", "## Wall-clock time", "", "| stage | seconds |", "|---|---|"]
        out += [f"| {k} | {v:.1f} |" for k, v in summary["timings"].items()]
        spec = summary.get("speculative", {})
        if "tokens_per_s_plain" in spec:
            out += ["", decode_line(spec)]
    captions = {
        "losses.png": "Next-token loss (solid, moving average), MTP loss (dashed) and held-out loss (dots); the "
        "dotted line marks the start of mid-training.",
        "lr.png": "Learning rate schedule of each stage.",
        "expert_load.png": "Router balance: max expert load over mean load, averaged over MoE layers. Loss-free "
        "balancing (a bias per expert, no auxiliary loss gradient) pulls it towards 1.",
        "perplexity_by_position.png": "Held-out loss at each token position before and after mid-training.",
        "accepted_length.png": "Tokens produced per verify step with the MTP layer drafting.",
    }
    out += ["", "## Plots", ""]
    for name in drawn:
        out += [f"![{name}](plots/{name})", "", captions.get(name, ""), ""]
    if summary.get("samples"):
        out += ["## Samples", ""]
        for s in summary["samples"]:
            out += [f"**{s.get('model', 'model')}**, prompt `{s['prompt'][:60]!r}`:", "", "```python",
                    s["prompt"] + s["completion"], "```", ""]
    if summary.get("conversations"):
        out += ["## Conversations", ""]
        for s in summary["conversations"]:
            out += [f"**{s.get('model', 'model')}**, user: {s['prompt']!r}", "", "```", s["completion"], "```", ""]
    if summary.get("config"):
        out += ["## Configuration", "", "```json", json.dumps(summary["config"], indent=2), "```", ""]
    if summary.get("missing"):
        out += ["## Not run", ""] + [f"- {m}" for m in summary["missing"]] + [""]
    return "\n".join(out)


def write_report(run_dir: str | Path, summary: dict | None = None) -> Path:
    """Draw plots into run_dir/plots and write run_dir/report.md; `summary` defaults to run_dir/summary.json."""
    run_dir = Path(run_dir)
    if summary is None:
        path = run_dir / "summary.json"
        summary = json.loads(path.read_text()) if path.exists() else {}
    plots = run_dir / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    drawn = plot_training(run_dir, plots)
    drawn += plot_perplexity(summary.get("perplexity_by_position", {}), plots, summary.get("position_marks", ()))
    drawn += plot_accepted(summary.get("speculative", {}), plots)
    report = run_dir / "report.md"
    report.write_text(_markdown(summary, drawn))
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m glmstack.report", description=__doc__.split("\n")[0])
    p.add_argument("run_dir", help="run folder holding <stage>/metrics.jsonl and summary.json")
    args = p.parse_args(argv)
    print(write_report(args.run_dir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
