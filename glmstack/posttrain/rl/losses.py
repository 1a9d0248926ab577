"""RL objectives as small pure functions: GRPO with clip-higher, IcePop / TIS mismatch weights, GLM-5's direct
double-sided importance sampling (DIS), on-policy distillation advantages, GSPO, CISPO, Dr.GRPO, entropy, KL.

Why pure functions: every RL stage (reasoning, agentic, general, distillation) is the same loop with a different
objective, and an objective is only trustworthy once its gradient is checked by hand (tests/unit/test_rl_losses.py).
Formulas follow GLM-5 (arXiv 2602.15763) Eq. 1 (GRPO + IcePop, KL removed), Eqs. 3–5 (DIS) and Eq. 2
(cross-stage distillation); GLM-4.5 (arXiv 2508.06471) §3.2 (token-mean loss for code RL); DAPO (arXiv 2503.14476,
clip-higher, token-level loss); IcePop (Ring-1T, arXiv 2510.18855); TIS (Yao et al. 2025, truncated importance
sampling); GSPO (arXiv 2507.18071); CISPO (MiniMax-M1, arXiv 2506.13585); Dr.GRPO (arXiv 2503.20783).

Notation (all tensors float, `[B, T]` per token unless said): `logp` log π_θ(y_t) of the policy being trained (with
gradient), `old_logp` log π_θ_old(y_t) from the trainer at the weights that sampled the batch (no gradient),
`rollout_logp` the log-probability the ROLLOUT ENGINE reported when it sampled y_t, `mask` 1 on trained tokens
(the model's own tokens; 0 on prompt, tool output, padding), `advantages` `[B]` (one per sample, broadcast over its
tokens) or `[B, T]` (per token, e.g. distillation). A loss is minimised; its value near 0 is expected for
GRPO-style objectives (advantages are centred within each group, and at the first step r = 1), so watch reward and
held-out accuracy, not the loss.

Reductions (`reduction=`): "sample" — mean over samples of each sample's token mean (GRPO, GLM-5 Eq. 1's 1/|y_i|;
a sample without trained tokens contributes 0 and still counts); "token" — sum over all trained tokens / their
number (DAPO, GLM-4.5 code RL); "constant" — sum / (B · `max_len`) (Dr.GRPO's constant divisor).

    adv = group_advantages(rewards, group_size=8)                      # [N]
    loss, stats = policy_loss(logp, old_logp, adv, mask, rollout_logp=rollout_logp, mismatch="icepop")
"""

from __future__ import annotations

import torch

from glmstack.inference.sampling import SamplingParams, filter_logits

REDUCTIONS = ("sample", "token", "constant")
MISMATCH = ("none", "tis", "icepop")
KL_KINDS = ("k1", "k2", "k3")


# ----------------------------------------------------------------------------------------- advantages


def group_advantages(rewards: torch.Tensor, group_size: int, std_normalize: bool = True) -> torch.Tensor:
    """GRPO's group-relative advantage, rewards `[N]` laid out as consecutive groups of `group_size`.

    A_i = (R_i − mean_g R) / (std_g R + 1e-6), std with Bessel's correction (torch.std; slime and GLM-5 Eq. 1);
    without `std_normalize` A_i = R_i − mean_g R (Dr.GRPO; GLM-5's agentic RL). A group of one has no baseline
    to subtract from itself: its advantage is 0 (as slime, which turns std normalisation off at group size 1).
    """
    rewards = rewards.float()
    if group_size < 1 or rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    r_GS = rewards.view(-1, group_size)
    centred = r_GS - r_GS.mean(dim=1, keepdim=True)
    if std_normalize and group_size > 1:
        centred = centred / (r_GS.std(dim=1, keepdim=True) + 1e-6)
    return centred.reshape(-1)


def distill_advantages(teacher_logp: torch.Tensor, student_logp: torch.Tensor) -> torch.Tensor:
    """On-policy distillation (GLM-5 Eq. 2): A_t = sg[log π_teacher(y_t) − log π_student(y_t)], `[B, T]`.

    Used in place of the group advantage with group size 1: the student is pushed up where the teacher finds its
    token likelier than it does, down elsewhere (a per-token reverse-KL estimate).
    """
    return (teacher_logp - student_logp).detach()


# ----------------------------------------------------------------------------------------- log-probs


def token_logprobs(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0
) -> torch.Tensor:
    """log π(tokens) under the rollout's sampling transform: logits / temperature restricted to the same top-k /
    top-p nucleus the sampler used (glmstack.inference.sampling.filter_logits, the one definition both sides share),
    so that ratios against the rollout engine compare like with like (slime computes trainer log-probs the same way).

    logits `(B, T, V)`, tokens `(B, T)` long -> `(B, T)` float32, differentiable in logits. A token outside the
    nucleus gets −inf (it could not have been sampled).
    """
    params = SamplingParams(temperature=temperature if temperature > 0 else 1.0, top_p=top_p, top_k=top_k)
    logp_BTV = torch.log_softmax(filter_logits(logits, params), dim=-1)
    return logp_BTV.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def entropy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Per-token entropy of softmax(logits / temperature), `(B, T, V)` -> `(B, T)`."""
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token KL(π_θ ‖ π_ref) estimate from sampled tokens, δ = log π_θ − log π_ref (Schulman's estimators):
    k1 = δ, k2 = δ²/2, k3 = exp(−δ) − 1 + δ (unbiased, always ≥ 0). GLM-4.5/5 train without it; here to compare."""
    delta = logp - ref_logp
    if kind == "k1":
        return delta
    if kind == "k2":
        return 0.5 * delta.square()
    if kind == "k3":
        return torch.expm1(-delta) + delta
    raise ValueError(f"kind must be one of {KL_KINDS}, got {kind!r}")


# ----------------------------------------------------------------------------------------- reduction


def reduce(per_token: torch.Tensor, mask: torch.Tensor, reduction: str = "sample", max_len: int | None = None):
    """Reduce a `[B, T]` per-token loss over the trained tokens (see the module docstring for the three rules)."""
    m = mask.to(per_token.dtype)
    total_BT = per_token * m
    if reduction == "sample":
        return (total_BT.sum(-1) / m.sum(-1).clamp(min=1)).mean()
    if reduction == "token":
        return total_BT.sum() / m.sum().clamp(min=1)
    if reduction == "constant":
        if not max_len:
            raise ValueError("reduction='constant' (Dr.GRPO) needs max_len, the constant token divisor")
        return total_BT.sum() / (per_token.shape[0] * max_len)
    raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    m = mask.to(torch.float32)
    return float((x.float() * m).sum() / m.sum().clamp(min=1))


def _per_token(advantages: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """`[B]` advantages broadcast over tokens; `[B, T]` kept. Never differentiated."""
    a = advantages.detach().to(like.dtype)
    return a.unsqueeze(-1).expand_as(like) if a.dim() == 1 else a


# ----------------------------------------------------------------------------------------- objectives


def mismatch_weight(old_logp: torch.Tensor, rollout_logp: torch.Tensor, mismatch: str, low: float, high: float):
    """Train/inference mismatch correction, ρ = π_train_old / π_infer_old = exp(old_logp − rollout_logp), no gradient.

    "tis": clip(ρ, low, high) (truncated importance sampling); "icepop": ρ where low ≤ ρ ≤ high, else 0 (GLM-5
    Eq. 1's pop(ρ, 1/β, β) with β = 2 -> [0.5, 2]; a closed interval, as slime). Returns (weight `[B, T]`, zeroed
    bool `[B, T]`: tokens the correction removed or truncated).
    """
    rho = torch.exp(old_logp.detach() - rollout_logp.detach())
    if mismatch == "tis":
        return rho.clamp(low, high), (rho < low) | (rho > high)
    if mismatch == "icepop":
        keep = (rho >= low) & (rho <= high)
        return torch.where(keep, rho, torch.zeros_like(rho)), ~keep
    raise ValueError(f"mismatch must be one of {MISMATCH}, got {mismatch!r}")


def policy_loss(
    logp,
    old_logp,
    advantages,
    mask,
    *,
    rollout_logp=None,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    reduction: str = "sample",
    mismatch: str = "none",
    mismatch_low: float = 0.5,
    mismatch_high: float = 2.0,
    max_len: int | None = None,
) -> tuple[torch.Tensor, dict]:
    """GRPO / PPO clipped surrogate with clip-higher and an optional mismatch correction (GLM-5 Eq. 1).

        r_t = exp(logp_t − old_logp_t)
        ℓ_t = w_t · max(−r_t A_t, −clip(r_t, 1 − eps_low, 1 + eps_high) A_t)
        loss = reduce(ℓ, mask)                       w_t = 1, or mismatch_weight(...) ("tis" | "icepop")

    stats: `clip_frac` (trained tokens where the clipped branch is taken), `mismatch_masked_frac` (tokens the
    correction zeroed or truncated), `mean_abs_logp_diff` (mean |old_logp − rollout_logp|, the mismatch itself),
    `ratio_mean`.
    """
    ratio = torch.exp(logp - old_logp.detach())
    adv = _per_token(advantages, logp)
    unclipped = -ratio * adv
    clipped = -ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * adv
    per_token = torch.maximum(unclipped, clipped)
    stats = {
        "clip_frac": _masked_mean(clipped > unclipped, mask),
        "ratio_mean": _masked_mean(ratio.detach(), mask),
        "mismatch_masked_frac": 0.0,
        "mean_abs_logp_diff": 0.0,
    }
    if rollout_logp is not None:
        stats["mean_abs_logp_diff"] = _masked_mean((old_logp - rollout_logp).abs(), mask)
    if mismatch != "none":
        if rollout_logp is None:
            raise ValueError(f"mismatch={mismatch!r} needs rollout_logp, the rollout engine's log-probs")
        weight, zeroed = mismatch_weight(old_logp, rollout_logp, mismatch, mismatch_low, mismatch_high)
        per_token = per_token * weight
        stats["mismatch_masked_frac"] = _masked_mean(zeroed, mask)
    return reduce(per_token, mask, reduction, max_len), stats


def dis_loss(
    logp,
    rollout_logp,
    advantages,
    mask,
    *,
    eps_low: float,
    eps_high: float,
    reduction: str = "sample",
    max_len: int | None = None,
) -> tuple[torch.Tensor, dict]:
    """GLM-5's direct double-sided importance sampling (Eqs. 3–5), against the rollout engine's log-probs only
    (no θ_old recompute):

        r_t = exp(logp_t − rollout_logp_t),   f(r) = r if 1 − eps_low < r < 1 + eps_high else 0 (open interval)
        ℓ_t = −sg[f(r_t)] · A_t · logp_t      (gradient: −f(r_t) A_t ∇log π)

    Tokens outside the interval drop out on both sides, whatever the advantage's sign. stats: `masked_frac`.
    """
    ratio = torch.exp(logp.detach() - rollout_logp.detach())
    keep = (ratio > 1.0 - eps_low) & (ratio < 1.0 + eps_high)
    weight = torch.where(keep, ratio, torch.zeros_like(ratio))
    per_token = -weight * _per_token(advantages, logp) * logp
    stats = {"masked_frac": _masked_mean(~keep, mask), "mean_abs_logp_diff": _masked_mean((ratio.log()).abs(), mask)}
    return reduce(per_token, mask, reduction, max_len), stats


def cispo_loss(
    logp,
    old_logp,
    advantages,
    mask,
    *,
    eps_low: float = 1.0,
    eps_high: float = 0.28,
    reduction: str = "token",
    max_len: int | None = None,
) -> tuple[torch.Tensor, dict]:
    """CISPO (MiniMax-M1): ℓ_t = −sg[clip(r_t, 1 − eps_low, 1 + eps_high)] · A_t · logp_t — the ratio is clipped as a
    weight, never as a gradient cut-off, so every token keeps a gradient (eps_low = 1: one-sided, as the paper)."""
    ratio = torch.exp(logp.detach() - old_logp.detach())
    weight = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    per_token = -weight * _per_token(advantages, logp) * logp
    stats = {"clip_frac": _masked_mean((ratio < 1.0 - eps_low) | (ratio > 1.0 + eps_high), mask)}
    return reduce(per_token, mask, reduction, max_len), stats


def gspo_loss(
    logp, old_logp, advantages, mask, *, eps_low: float = 3e-4, eps_high: float = 4e-4
) -> tuple[torch.Tensor, dict]:
    """GSPO: one ratio per sequence, s_i = exp(mean_t (logp − old_logp) over its trained tokens), then the clipped
    surrogate per sequence, averaged over sequences. `advantages` `[B]`. Default clip range: the GSPO paper's."""
    m = mask.to(logp.dtype)
    s_B = torch.exp(((logp - old_logp.detach()) * m).sum(-1) / m.sum(-1).clamp(min=1))
    adv = advantages.detach().to(logp.dtype)
    unclipped, clipped = -s_B * adv, -s_B.clamp(1.0 - eps_low, 1.0 + eps_high) * adv
    loss = torch.maximum(unclipped, clipped).mean()
    return loss, {"clip_frac": float((clipped > unclipped).float().mean()), "ratio_mean": float(s_B.detach().mean())}


def regularised(
    loss: torch.Tensor,
    mask: torch.Tensor,
    *,
    entropy_BT: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
    kl_BT: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    reduction: str = "sample",
    max_len: int | None = None,
) -> torch.Tensor:
    """loss − entropy_coef · H̄ + kl_coef · KL̄, both reduced like the policy loss (slime's total loss). Off by default:
    GLM-4.5/5 remove the KL term; GLM-5's agentic RL adds a small entropy bonus."""
    if entropy_coef and entropy_BT is not None:
        loss = loss - entropy_coef * reduce(entropy_BT, mask, reduction, max_len)
    if kl_coef and kl_BT is not None:
        loss = loss + kl_coef * reduce(kl_BT, mask, reduction, max_len)
    return loss
