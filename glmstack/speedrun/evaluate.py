"""The speedrun's evaluation stage: loss by token position before and after mid-training on held-out code,
code samples, and MTP speculative decoding (acceptance per depth, checked token for token against plain greedy).
It also copies the final post-trained model (RL's, else SFT's: weights, tokenizer, chat template) to <out>/model/,
the folder `glmstack serve` and `glmstack chat` take.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tqdm import tqdm

from glmstack.speedrun.run import Run

EVAL_WINDOWS = 64  # held-out windows for loss by position
SAMPLE_PROMPTS = ["import os\n\n\ndef ", "class Stack:\n    def __init__(self", "    for i in range("]
SAMPLE_TOKENS = 80  # new tokens per sample
SPEC_PROMPTS, SPEC_PROMPT_TOKENS, SPEC_TOKENS, DRAFT_K = 8, 24, 48, 3  # MTP speculative decoding measurement


def stage_evaluate(run: Run) -> dict:
    """Loss by position before/after mid-training, code samples, MTP speculative decoding statistics."""
    import torch

    from glmstack.eval import loss_by_position
    from glmstack.inference import Engine
    from glmstack.speedrun.posttrain import final_model

    tok, models = run.tokenizer(), {s: _load(run, s) for s in ("pretrain", "midtrain")}
    seqs = held_out_windows(run.stage_dir("data") / "midtrain" / "eval", run.size.mid_seq_len + 1, n=EVAL_WINDOWS)
    nll = {s: loss_by_position(m, seqs).tolist() for s, m in tqdm(models.items(), desc="loss by position")}
    engine = Engine(models["midtrain"], tok)
    samples = engine.generate(SAMPLE_PROMPTS, max_new_tokens=SAMPLE_TOKENS, temperature=0.7, top_p=0.95,
                              seed=run.seed)
    copy_folder(final_model(run), run.out / "model")  # `glmstack serve runs/speedrun/model`
    return {
        "perplexity_by_position": nll,
        "samples": [{"model": "mid-trained", "prompt": p, "completion": c} for p, c in zip(SAMPLE_PROMPTS, samples.text)],
        "speculative": speculative_stats(engine, seqs[:SPEC_PROMPTS, : SPEC_PROMPT_TOKENS + DRAFT_K + 1]),
        "params": {"total": models["midtrain"].num_params(), "active": models["midtrain"].num_params(active=True)},
        "threads": torch.get_num_threads(),
    }


def copy_folder(src: Path, dst: Path) -> None:
    """Copy a model folder's files through a temporary folder, so <out>/model is either whole or absent."""
    import shutil

    tmp = dst.with_name(f".{dst.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp, ignore=shutil.ignore_patterns("trainer_state"))
    shutil.rmtree(dst, ignore_errors=True)
    tmp.rename(dst)


def _load(run: Run, stage: str):
    """The stage's newest complete checkpoint as a GLM in fp32."""
    import torch

    from glmstack.model import load_hf
    from glmstack.train.checkpoint import latest

    return load_hf(latest(run.stage_dir(stage)), dtype=torch.float32).eval()


def held_out_windows(folder: Path, length: int, n: int):
    """Up to `n` non-overlapping windows of `length` tokens from inside held-out documents (N, length)."""
    import torch

    from glmstack.data.shards import TokenShards

    shards, windows = TokenShards(folder), []
    for i in range(shards.n_docs):
        doc = shards.doc(i)
        windows += [doc[s : s + length] for s in range(0, len(doc) - length + 1, length)]
        if len(windows) >= n:
            break
    if not windows:  # documents all shorter than a window: cut the concatenated stream instead
        stream = shards.span(0, min(shards.n_tokens, n * length))
        windows = [stream[s : s + length] for s in range(0, len(stream) - length + 1, length)]
    return torch.tensor(np.stack(windows[:n]), dtype=torch.long)


def speculative_stats(engine, windows) -> dict:
    """Greedy MTP speculative decoding (k = DRAFT_K) of the windows' first SPEC_PROMPT_TOKENS tokens as one batch,
    checked against plain greedy, with the cost model that bounds its speed-up (glmstack.inference.spec_cost:
    phase times measured at the same batch and position)."""
    from glmstack.inference.spec_cost import phase_costs, round_cost, speedup_bound

    prompts = windows[:, :SPEC_PROMPT_TOKENS].tolist()
    plain = engine.generate(prompts, max_new_tokens=SPEC_TOKENS, temperature=0.0)
    spec = engine.generate(prompts, max_new_tokens=SPEC_TOKENS, temperature=0.0, speculative="mtp", draft_k=DRAFT_K)
    per_depth = [round(p, 6) for p in spec.stats["acceptance_per_depth"]]
    tau = spec.stats["mean_accepted_length"]
    phases = phase_costs(engine, windows, ks=(DRAFT_K,))
    return {"draft_k": DRAFT_K, "batch": len(prompts), "new_tokens": SPEC_TOKENS, "mean_accepted": tau,
            "acceptance_per_depth": per_depth, "histogram": accepted_histogram(per_depth),
            "equals_greedy": spec.tokens == plain.tokens, "verify_steps": spec.stats["verify_steps"],
            "tokens_per_s_plain": plain.stats["tokens_per_s"], "tokens_per_s_mtp": spec.stats["tokens_per_s"],
            "phase_ms": phases, "round_over_plain": round_cost(phases, DRAFT_K) / phases["plain"],
            "speedup_bound": speedup_bound(phases, DRAFT_K, tau)}  # fmt: skip


def accepted_histogram(acceptance_per_depth: list[float]) -> dict[int, float]:
    """P(tokens per verify step = j) from P(drafts accepted >= j) per depth j = 1..k."""
    ge = [1.0] + list(acceptance_per_depth) + [0.0]
    return {j + 1: round(ge[j] - ge[j + 1], 6) for j in range(len(ge) - 1)}
