"""Schedules as pure functions of the step: learning rate, batch size, MTP weight, balancing rate.

Everything that changes during a stage is a function `f(step) -> value` over a small table in ScheduleConfig,
so resuming needs nothing but the step, and a curriculum reads as data (modded-nanogpt style):

- lr: linear warm-up, then cosine decay to `final_lr_frac` of the peak (GLM-4.5 §2.4: 2.5e-4 -> 2.5e-5 by the
  end of mid-training), or WSD (warm-up, stable, decay over the last `wsd_decay_frac`; MiniCPM, arXiv 2404.06395).
  `step_offset` lets mid-training continue one decay that spans both stages.
- batch size in tokens/step: linear in the tokens consumed, from `batch_warmup_start_tokens` to the full batch
  over the first `batch_warmup_tokens` (GLM-4.5: 16M -> 64M over the first 500B tokens); the loop turns it into a
  number of accumulated micro-batches. In tokens, not steps: a ramp over N steps of growing batches would end
  after ~(start + full)/2 · N tokens, 62% of the N · full a step-count taken from the paper's tokens intends.
- MTP loss weight (GLM-4.5: 0.3, then 0.1) and balancing bias rate u (0.001 for the first 15T tokens, then 0):
  piecewise-constant tables [[from_step, value], ...].

A stage that continues a curve (`step_offset` > 0) keeps the pre-training `warmup_steps`: the cosine's phase
depends on it, so zeroing it in mid-training would jump the lr (tests/unit/test_fidelity.py checks every recipe).
`rewarmup` is a linear ramp over a stage's first steps, multiplied on, for a stage that starts from a checkpoint
without its optimizer state (the loop decides; see TrainConfig.optim_state).

Sequence length and RoPE base change per *stage* (4K/θ=1e4 in pre-training, 32K/θ=1e6 in mid-training) and
live in the stage config, not here.
"""

from __future__ import annotations

import math


def piecewise(table: list[list[float]] | list[tuple[int, float]], step: int) -> float:
    """Value of a [[from_step, value], ...] table at `step` (the last row whose from_step <= step)."""
    assert table and table[0][0] == 0, f"a schedule table must start at step 0, got {table}"
    value = table[0][1]
    for start, v in table:
        if step >= start:
            value = v
    return float(value)


def lr_multiplier(
    step: int, *, kind: str, warmup_steps: int, total_steps: int, final_frac: float, wsd_decay_frac: float = 0.2
) -> float:
    """Fraction of the peak lr at `step` (0-based; step 0 already gets a non-zero lr)."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if kind == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))  # 0 -> 1 after warm-up
    if kind == "cosine":
        return final_frac + (1 - final_frac) * 0.5 * (1 + math.cos(math.pi * progress))
    if kind == "wsd":
        decay_start = 1 - wsd_decay_frac
        if progress <= decay_start:
            return 1.0
        return 1 - (1 - final_frac) * (progress - decay_start) / wsd_decay_frac
    raise ValueError(f"unknown lr schedule {kind!r}; use cosine, wsd or constant")


def batch_tokens(consumed: int, *, full_tokens: int, start_tokens: int, warmup_tokens: int) -> int:
    """Tokens per optimizer step after `consumed` tokens: linear from start_tokens to full_tokens over warmup_tokens."""
    if start_tokens <= 0 or warmup_tokens <= 0 or consumed >= warmup_tokens:
        return full_tokens
    return int(start_tokens + (full_tokens - start_tokens) * consumed / warmup_tokens)


def accum_steps(consumed: int, sched, *, tokens_per_micro: int, full_accum: int) -> int:
    """Micro-batches to accumulate after `consumed` tokens (this rank's) so a step holds ~batch_tokens (>= 1)."""
    full = tokens_per_micro * full_accum
    tokens = batch_tokens(
        consumed, full_tokens=full, start_tokens=sched.batch_warmup_start_tokens, warmup_tokens=sched.batch_warmup_tokens
    )
    return max(1, min(full_accum, round(tokens / tokens_per_micro)))


def values_at(step: int, sched, *, stage_steps: int, rewarmup: bool = False) -> dict[str, float]:
    """Every scheduled scalar at a stage step: {'lr_mult', 'mtp_weight', 'balance_rate'} (pure).

    rewarmup: this stage started without its optimizer state; the lr ramps in over `sched.rewarmup_steps`."""
    s = step + sched.step_offset
    ramp = min(1.0, (step + 1) / sched.rewarmup_steps) if rewarmup and sched.rewarmup_steps > 0 else 1.0
    total = sched.total_steps if sched.total_steps is not None else stage_steps + sched.step_offset
    return {
        "lr_mult": lr_multiplier(
            s,
            kind=sched.lr,
            warmup_steps=sched.warmup_steps,
            total_steps=total,
            final_frac=sched.final_lr_frac,
            wsd_decay_frac=sched.wsd_decay_frac,
        )
        * ramp,
        "mtp_weight": piecewise(sched.mtp_weight, s),
        "balance_rate": piecewise(sched.balance_rate, s),
    }
