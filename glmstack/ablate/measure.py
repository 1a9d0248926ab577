"""Measurements the claims share: losses from the run's metrics, attention logits, spikes, document NLL, MTP
acceptance. Each takes an `ArmRun` (glmstack/ablate/runner.py) or a model and returns plain floats.

Validation losses come from the loop itself (`log.val_every` = the last step, `log.val_batches` fixed batches of
the held-out stream), so every arm of a seed is scored on the same tokens.
"""

from __future__ import annotations

import contextlib
import math

import numpy as np
import torch

from glmstack.model import attention


def val_loss(run) -> float:
    """The last validation loss of the arm's final stage (LM loss only: MTP and aux terms excluded)."""
    rows = [r for r in run.rows() if "val_loss" in r]
    return float(rows[-1]["val_loss"]) if rows else math.nan


def val_batches(run, model, n: int) -> list[dict]:
    """The first `n` batches of the arm's held-out stream (the loop validates on the same ones)."""
    import itertools

    from glmstack.train.stage import build_data

    return list(itertools.islice(iter(build_data(run.cfg, model.cfg.vocab_size, split="val")), n))


def tail_mean(rows: list[dict], key: str, frac: float = 0.2) -> float:
    """Mean of `key` over the last `frac` of the rows that have it."""
    vals = [r[key] for r in rows if key in r and math.isfinite(r[key])]
    if not vals:
        return math.nan
    return float(np.mean(vals[-max(1, int(len(vals) * frac)):]))


def spikes(rows: list[dict], factor: float = 1.2) -> int:
    """Steps whose loss exceeds the running mean (EMA 0.9) of the loss by more than `factor` (or is not finite)."""
    ema, n = None, 0
    for r in rows:
        loss = r["loss"]
        if ema is not None and (not math.isfinite(loss) or loss > factor * ema):
            n += 1
        if math.isfinite(loss):
            ema = loss if ema is None else 0.9 * ema + 0.1 * loss
    return n


@contextlib.contextmanager
def record_attention_logits():
    """Within the block, every GQA attention call records max |q·k|/sqrt(d) into the yielded list (by call)."""
    seen: list[float] = []
    plain = attention.sdpa

    def spy(q_BHTK, k_BGSK, v_BGSK, mask=None):
        H, G = q_BHTK.shape[1], k_BGSK.shape[1]
        k_BHSK = k_BGSK.repeat_interleave(H // G, dim=1)
        s_BHTS = q_BHTK @ k_BHSK.transpose(-1, -2) * q_BHTK.shape[-1] ** -0.5
        T, S = s_BHTS.shape[-2:]
        causal = torch.ones(T, S, dtype=torch.bool, device=s_BHTS.device).tril(S - T)
        seen.append(float(s_BHTS.abs().masked_fill(~causal, 0).max()))
        return plain(q_BHTK, k_BGSK, v_BGSK, mask)

    attention.sdpa = spy
    try:
        yield seen
    finally:
        attention.sdpa = plain


@torch.no_grad()
def max_attention_logit(model, batches: list[dict]) -> float:
    """The largest pre-softmax attention logit of any head, layer and position over `batches`."""
    with record_attention_logits() as seen:
        for b in batches:
            model(b["input_ids"])
    return max(seen)


@torch.no_grad()
def token_nll(model, ids: list[int], targets: list[int]) -> tuple[float, int]:
    """Summed NLL of ids[p] at each position p in `targets` (predicted from ids[:p]), and the count."""
    logits = model(torch.tensor([ids[:-1]])).logits[0]  # (T-1, V)
    pos = torch.tensor([p - 1 for p in targets])
    logp = torch.log_softmax(logits[pos].float(), -1)
    return float(-logp.gather(1, torch.tensor(ids)[pos + 1, None]).sum()), len(targets)


@torch.no_grad()
def accuracy(model, ids: list[int], targets: list[int]) -> tuple[int, int]:
    """Greedy next-token hits at positions `targets`, and their count."""
    logits = model(torch.tensor([ids[:-1]])).logits[0]
    pred = logits[torch.tensor(targets) - 1].argmax(-1)
    return int((pred == torch.tensor(ids)[torch.tensor(targets)]).sum()), len(targets)


def mtp_acceptance(model, prompts: list[list[int]], new_tokens: int = 24) -> float:
    """Share of one-token MTP drafts accepted in greedy decoding (the draft must equal the target's argmax; a
    sampled acceptance would be near 1 for any two near-uniform distributions, trained or not)."""
    from glmstack.inference import Engine

    out = Engine(model).generate(prompts, max_new_tokens=new_tokens, temperature=0.0, speculative="mtp", draft_k=1,
                                 stop_ids=[])
    return float(out.stats["acceptance_per_depth"][0])
