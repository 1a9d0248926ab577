"""The DPO objective on sequence log-probs, and the metrics TRL's DPOTrainer reports (the same names and reductions).

Why: DPO (Rafailov et al. 2023) trains the policy on preference pairs directly, with the frozen reference as the
implicit reward's baseline: r(x, y) = β (log π_θ(y|x) − log π_ref(y|x)), Δ = r(x, y_w) − r(x, y_l) over β.
  sigmoid  −log σ(βΔ); with label smoothing ε (cDPO, Mitchell 2023: a label is flipped with probability ε)
           (1 − ε)·(−log σ(βΔ)) + ε·(−log σ(−βΔ))
  ipo      (Δ̄ − 1/(2β))², Δ̄ the log-ratio difference with each side divided by its completion's token count (TRL
           normalises so, as the IPO authors confirmed to TRL; docs/dpo.md)
  + sft    `sft_weight` α adds α · the chosen completions' mean token NLL (RPO, Pang et al. 2024: without it DPO can
           lower the chosen reply's likelihood with the rejected one's, and a reasoning model's greedy accuracy falls;
           TRL: loss_type ["sigmoid", "sft"], loss_weights [1, α])
Log-probs are summed over the completion's (assistant) tokens only. Every reduction is a mean over pairs, as
TRL's; tests/parity/test_dpo_trl.py checks loss, gradient and metrics against TRL's own `_compute_loss`.

    loss, metrics = dpo_loss(logps_c, logps_r, ref_c, ref_r, n_c, n_r, beta=0.1)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

LOSS_TYPES = ("sigmoid", "ipo")


def completion_logps(logits: torch.Tensor, input_ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """logits `(B, T, V)`, input_ids and mask `(B, T)` (1 on completion tokens) -> (Σ log π(token) over the masked
    tokens `(B,)`, their count `(B,)`). Position t's logits score token t+1; the first token is never scored."""
    from glmstack.posttrain.rl.losses import token_logprobs

    return completion_sums(token_logprobs(logits[:, :-1], input_ids[:, 1:]).float(), mask)


def batch_logps(logits: torch.Tensor, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """A micro-batch's completion log-prob sums and counts per sequence `(2B,)`, padded (one sequence a row) or packed
    (`seq_of (R, T)`: which of the 2B sequences each token belongs to, −1 on padding; data.pack_rows)."""
    if "seq_of" not in batch:
        return completion_logps(logits, batch["input_ids"], batch["loss_mask"])
    from glmstack.posttrain.rl.losses import token_logprobs

    logp_RT = token_logprobs(logits[:, :-1], batch["input_ids"][:, 1:]).float()  # scores tokens 1..T-1
    seq_RT, m_RT = batch["seq_of"][:, 1:], batch["loss_mask"][:, 1:].to(logp_RT.dtype)
    keep = seq_RT >= 0
    n = int(batch["seq_of"].max()) + 1
    sums = logp_RT.new_zeros(n).index_add(0, seq_RT[keep], (logp_RT * m_RT)[keep])
    return sums, m_RT.new_zeros(n).index_add(0, seq_RT[keep], m_RT[keep])


def completion_sums(logp_BT: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probs `(B, T-1)` (of tokens 1..T-1), mask `(B, T)` -> (masked sums `(B,)`, counts `(B,)`)."""
    m_BT = mask[:, 1:].to(logp_BT.dtype)
    return (logp_BT * m_BT).sum(-1), m_BT.sum(-1)


def dpo_loss(logps_c, logps_r, ref_c, ref_r, n_c, n_r, *, beta: float, label_smoothing: float = 0.0,
             loss_type: str = "sigmoid", sft_weight: float = 0.0) -> tuple[torch.Tensor, dict]:  # fmt: skip
    """All inputs `(B,)` (policy / reference log-probs of the chosen and rejected completions, their token counts);
    -> (mean loss over pairs, TRL's metrics: rewards/{chosen,rejected,accuracies,margins}, logps/{chosen,rejected})."""
    ratio_c, ratio_r = logps_c - ref_c, logps_r - ref_r  # (B,) log π_θ/π_ref of each side
    if loss_type == "sigmoid":
        z = beta * (ratio_c - ratio_r)
        per_pair = -(1 - label_smoothing) * F.logsigmoid(z) - label_smoothing * F.logsigmoid(-z)
    elif loss_type == "ipo":
        delta = ratio_c / n_c.clamp(min=1) - ratio_r / n_r.clamp(min=1)  # per-token log ratios (TRL's IPO)
        per_pair = (delta - 1 / (2 * beta)) ** 2
    else:
        raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")
    metrics = reward_metrics(logps_c, logps_r, ratio_c, ratio_r, beta)
    if not sft_weight:
        return per_pair.mean(), metrics
    nll = -logps_c.sum() / n_c.sum().clamp(min=1)  # the chosen completions' mean token NLL (TRL's "sft")
    return per_pair.mean() + sft_weight * nll, metrics | {"sft_nll": nll.detach()}


def reward_metrics(logps_c, logps_r, ratio_c, ratio_r, beta: float) -> dict:
    """The implicit rewards β·log-ratio and their summaries, detached (TRL reports β·ratio for every loss type)."""
    r_c, r_r = beta * ratio_c.detach(), beta * ratio_r.detach()
    return {"rewards/chosen": r_c.mean(), "rewards/rejected": r_r.mean(),
            "rewards/accuracies": (r_c > r_r).float().mean(), "rewards/margins": (r_c - r_r).mean(),
            "logps/chosen": logps_c.detach().mean(), "logps/rejected": logps_r.detach().mean()}  # fmt: skip
