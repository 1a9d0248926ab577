"""The speedrun's report stage: the figures of summary.json (deterministic for one seed) from the stages'
DONE.json results and metrics.jsonl files, then report.md and plots through glmstack.report.
"""

from __future__ import annotations

import json
from dataclasses import asdict

import numpy as np

from glmstack.speedrun.card import FUNCTION_ITEMS
from glmstack.speedrun.run import Run

# whose DONE.json the summary reads
RESULT_STAGES = ("tokenizer", "data", "pretrain", "midtrain", "sft", "rl", "agentic", "general", "evaluate", "card")


def stage_report(run: Run) -> dict:
    from glmstack.report import write_report

    summary = build_summary(run)
    (run.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return {"report": str(write_report(run.out, summary))}


def _val_losses(run: Run, stage: str) -> list[float]:
    from glmstack.train.metrics import read_metrics

    return [r["val_loss"] for r in read_metrics(run.stage_dir(stage) / "metrics.jsonl") if "val_loss" in r]


def _last_imbalance(run: Run, stage: str) -> float:
    from glmstack.report import imbalance
    from glmstack.train.metrics import read_metrics

    values = [imbalance(r) for r in read_metrics(run.stage_dir(stage) / "metrics.jsonl")]
    values = [v for v in values if v is not None][-10:]
    return sum(values) / len(values) if values else float("nan")


def _sig(x: float, digits: int = 6) -> float:
    return float(f"{x:.{digits}g}")


def build_summary(run: Run) -> dict:
    """Everything report.md shows; `figures` are deterministic for one seed, `timings` are wall-clock."""
    res = {name: run.result(name) for name in RESULT_STAGES}
    ev, size, split = res["evaluate"], run.size, run.size.seq_len - 1
    fig = {"model parameters": ev["params"]["total"], "active parameters per token": ev["params"]["active"],
           "vocabulary": res["tokenizer"]["vocab_size"]}
    for stage, d in ((k, v) for k, v in res["data"].items() if isinstance(v, dict)):
        fig |= {f"{stage} data: documents read": d["docs_read"], f"{stage} data: documents kept": d["docs_kept"],
                f"{stage} data: train tokens": d["train_tokens"], f"{stage} data: held-out tokens": d["eval_tokens"]}
    for stage in ("pretrain", "midtrain"):
        val = _val_losses(run, stage)
        fig |= {f"{stage} steps": res[stage]["step"], f"{stage} tokens": res[stage]["tokens"],
                f"{stage} val loss, first": _sig(val[0]) if val else float("nan"),
                f"{stage} val loss, last": _sig(val[-1]) if val else float("nan"),
                f"{stage} expert load max/mean, last 10 steps": _sig(_last_imbalance(run, stage))}
    fig |= {"sft steps": res["sft"]["step"], "sft tokens": res["sft"]["tokens"]}
    val = _val_losses(run, "sft")
    if val:
        fig |= {"sft val loss, first": _sig(val[0]), "sft val loss, last": _sig(val[-1])}
    if "skipped" in res["rl"]:
        fig["rl"] = "skipped: " + res["rl"]["skipped"]
    else:
        fig |= {"rl steps": res["rl"]["step"], "rl held-out accuracy, before": res["rl"]["heldout_acc_start"],
                "rl held-out accuracy, after": res["rl"]["heldout_acc"]}
    for stage in ("agentic", "general"):
        if "skipped" in res[stage]:
            fig[stage] = "skipped: " + res[stage]["skipped"]
        else:
            fig[f"{stage} steps"] = res[stage]["step"]
    for stage, nll in ev["perplexity_by_position"].items():
        fig[f"{stage}: held-out loss, positions < {size.seq_len}"] = _sig(float(np.mean(nll[:split])))
        fig[f"{stage}: held-out loss, positions {size.seq_len}-{size.mid_seq_len}"] = _sig(float(np.mean(nll[split:])))
    spec = ev["speculative"]
    fig["MTP mean accepted length"] = _sig(spec["mean_accepted"])
    fig |= {f"MTP acceptance at depth {j + 1}": p for j, p in enumerate(spec["acceptance_per_depth"])}
    fig["speculative output == greedy"] = spec["equals_greedy"]
    timings = {name: r["seconds"] for name, r in res.items()}
    return {
        "title": f"glmstack speedrun: {run.minutes:g}-minute budget, seed {run.seed}",
        "intro": INTRO.format(threads=ev["threads"], function_n=FUNCTION_ITEMS * size.card_n, **asdict(size)),
        "figures": fig, "timings": timings, "samples": ev["samples"], "card": res["card"]["card"],
        "conversations": res["card"]["samples"],
        "data_steps": {k: v["steps"] for k, v in res["data"].items() if isinstance(v, dict)},
        "perplexity_by_position": {"pre-trained (context " + str(size.seq_len) + ")": ev["perplexity_by_position"]["pretrain"],
                                   "mid-trained (context " + str(size.mid_seq_len) + ")": ev["perplexity_by_position"]["midtrain"]},
        "position_marks": [[size.seq_len, "pre-training context"]],
        "speculative": spec, "config": {"size": asdict(size), "seed": run.seed, "minutes": run.minutes},
    }


INTRO = ("The GLM-4.5 recipe at toy scale: a {num_hidden_layers}-layer MoE of width {hidden_size} "
         "({n_routed_experts} routed experts, top-2, 1 shared, one MTP layer) pre-trained for {pretrain_steps} steps "
         "at context {seq_len} and mid-trained for {midtrain_steps} steps at context {mid_seq_len} on the embedded "
         "corpus ({corpus_mb} MB of Python standard library source, docs and generated math), then fine-tuned for "
         "{sft_steps} SFT steps at context {sft_seq_len} in GLM's chat format, then GLM-5's RL sequence: {rl_steps} "
         "reasoning-RL steps, {agentic_steps} agentic-RL steps (tool episodes, distilling the reasoning-RL model) and "
         "{general_steps} general-RL steps (rules + distillation from every earlier stage), on {threads} CPU "
         "thread(s). The report card scores every stage's model on {card_n} held-out items per metric ({function_n} "
         "for tool task success and reasoning task accuracy, but for the pre- and mid-trained models, which have no "
         "chat format yet). Rerun with `glmstack speedrun`; redraw with `python -m glmstack.report <run folder>`.")
