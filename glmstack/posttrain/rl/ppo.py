"""PPO with a critic (`rl.loss=ppo`): the classic RLHF recipe (InstructGPT; ChatGLM-RLHF) beside GRPO on the one loop.

Why: GLM-4.5/5 train reasoning RL with GRPO, but the family's alignment before them (ChatGLM-RLHF, issue 39) was PPO
with a learned value baseline and a KL penalty to the SFT model. Here the pieces are small pure functions, checked by
hand in tests/unit/test_rl_ppo.py (GAE against a plain Python loop, the clipped value loss against its formula, a
gradient check), plus the two places they plug in:
  rollout batch  `rollout_fields` (called by rollouts.Rollouts only when rl.loss == "ppo"): the trainer's log-probs
                 and the critic's values at the rollout weights, the frozen reference's log-probs, per-token rewards
                 r_t = −kl_coef · (log π_old − log π_ref) with the sequence reward added at the last response token,
                 GAE(γ, λ) advantages (whitened over the batch's response tokens) and returns = advantages + values
  loss           `ppo_objective` (called by stage.rl_loss): the clipped policy surrogate (losses.policy_loss, with
                 rl.eps_low / rl.eps_high and rl.mismatch) + vf_coef · the clipped value loss.

The critic is a value head on the policy's own trunk (`attach_value_head`): a Linear(D -> 1) on the final normed hidden
state (`GLMOutput.hidden`), registered as `value_head` on the GLM before the optimiser is built, so it is optimised,
clipped, guarded and checkpointed (trainer_state/dcp) with the policy and a resume restores it exactly; the HF model
folder leaves it out (model/hf.py): the exported model is the policy only. Single process only (stage.check).

    glmstack rl rl_tiny --set rl.loss=ppo --set rl.kl_coef=0.05 --set rl.gae_lambda=0.95
"""

from __future__ import annotations

import torch
from torch import nn

from glmstack.posttrain.rl.losses import policy_loss, reduce, token_logprobs
from glmstack.posttrain.rl.replay import model_routes
from glmstack.train import dist

HEAD = "value_head"  # the GLM attribute; model/hf.py and optim/groups.py know the name


# ----------------------------------------------------------------------------------------- the critic


def attach_value_head(model, optim_cfg, seed: int = 0):
    """Register a fresh value head on the (unwrapped) GLM and return a new optimiser over policy + head. Weight
    N(0, initializer_range) from its own seeded stream (the global RNG is not consumed), bias 0: V ≈ 0 at the start."""
    from glmstack.optim import build_optimizer

    inner = dist.unwrap(model)
    ref = inner.embed_tokens.weight
    head = nn.Linear(inner.cfg.hidden_size, 1, device="meta").to_empty(device=ref.device).to(ref.dtype)
    g = torch.Generator().manual_seed(seed + 7919)
    with torch.no_grad():
        head.weight.copy_(torch.randn(tuple(head.weight.shape), generator=g) * inner.cfg.initializer_range)
        head.bias.zero_()
    inner.add_module(HEAD, head)
    return build_optimizer(inner, optim_cfg)[0]


def values_of(model, hidden_BTD: torch.Tensor) -> torch.Tensor:
    """V(s_t) per position from the trunk's final hidden state: (B, T, D) -> (B, T) float32. Position t's value goes
    with the target at t (the token sampled after seeing input t), like the log-probs."""
    return getattr(dist.unwrap(model), HEAD)(hidden_BTD).squeeze(-1).float()


# ----------------------------------------------------------------------------------------- rewards and GAE


def kl_rewards(seq_rewards_B, old_logp_BT, ref_logp_BT, mask_BT, kl_coef: float):
    """Per-token rewards with the KL penalty in the reward (InstructGPT, TRL's PPOTrainer):
    r_t = −kl_coef · kl_t on response tokens, kl_t = log π_old(y_t) − log π_ref(y_t) (the k1 estimate; 0 where a
    log-prob is not finite, a token outside the nucleus), plus the sequence reward at each row's last response token.
    -> (rewards (B, T), kl (B, T))."""
    m = (mask_BT > 0) & torch.isfinite(old_logp_BT) & torch.isfinite(ref_logp_BT)
    kl_BT = torch.where(m, old_logp_BT - ref_logp_BT, torch.zeros_like(old_logp_BT))
    rewards_BT = -kl_coef * kl_BT
    B, T = mask_BT.shape
    pos = (mask_BT > 0).float() * torch.arange(1, T + 1, dtype=torch.float32)
    last_B, has_B = pos.argmax(-1), (mask_BT > 0).any(-1)
    rewards_BT[torch.arange(B), last_B] += torch.where(has_B, seq_rewards_B.float(), torch.zeros(B))
    return rewards_BT, kl_BT


def gae(rewards_BT, values_BT, mask_BT, gamma: float, lam: float):
    """Generalised advantage estimation (Schulman et al. 2016) over each row's response tokens (mask > 0), in order;
    positions outside the mask are skipped (a tool output between two turns is not a step), the step after the last
    response token is terminal (V = 0):
        δ_t = r_t + γ V_next − V_t,   A_t = δ_t + γλ A_next,   R_t = A_t + V_t
    -> (advantages (B, T), returns (B, T)), both 0 outside the mask."""
    m = mask_BT > 0
    adv_BT = torch.zeros_like(rewards_BT)
    next_v, next_a = rewards_BT.new_zeros(rewards_BT.shape[0]), rewards_BT.new_zeros(rewards_BT.shape[0])
    for t in reversed(range(rewards_BT.shape[1])):
        a = rewards_BT[:, t] + gamma * next_v - values_BT[:, t] + gamma * lam * next_a
        adv_BT[:, t] = torch.where(m[:, t], a, torch.zeros_like(a))
        next_v = torch.where(m[:, t], values_BT[:, t], next_v)
        next_a = torch.where(m[:, t], a, next_a)
    return adv_BT, torch.where(m, adv_BT + values_BT, torch.zeros_like(adv_BT))


def whiten(x_BT, mask_BT, eps: float = 1e-8):
    """(x − mean) / sqrt(var + eps) over the masked tokens (population variance), 0 elsewhere: PPO's advantage
    normalisation across the whole rollout batch."""
    m = (mask_BT > 0).float()
    n = m.sum().clamp(min=1)
    mean = (x_BT * m).sum() / n
    var = ((x_BT - mean).square() * m).sum() / n
    return (x_BT - mean) * torch.rsqrt(var + eps) * m


# ----------------------------------------------------------------------------------------- the loss


def value_loss(values_BT, old_values_BT, returns_BT, mask_BT, clip: float, reduction: str = "sample"):
    """The PPO2 clipped value loss (OpenAI baselines, TRL): V_clip = V_old + clamp(V − V_old, −clip, clip),
        ℓ_t = ½ · max((V − R)², (V_clip − R)²)        (clip = 0: ½ (V − R)², unclipped)
    reduced like the policy loss. -> (loss, vf_clip_frac: masked share of tokens where the clipped branch is taken)."""
    err = (values_BT - returns_BT).square()
    if clip <= 0:
        return reduce(0.5 * err, mask_BT, reduction), 0.0
    v_clip = old_values_BT + (values_BT - old_values_BT).clamp(-clip, clip)
    err_clip = (v_clip - returns_BT).square()
    m = (mask_BT > 0).float()
    frac = float(((err_clip > err).float() * m).sum() / m.sum().clamp(min=1))
    return reduce(0.5 * torch.maximum(err, err_clip), mask_BT, reduction), frac


def explained_variance(values_BT, returns_BT, mask_BT) -> float:
    """1 − Var(R − V) / Var(R) over the masked tokens: 1 = the critic predicts the returns, 0 = no better than their
    mean, < 0 worse. Undefined when the returns are constant: reported 0."""
    m = (mask_BT > 0).float()
    n = m.sum().clamp(min=1)

    def var(x):
        mean = (x * m).sum() / n
        return float(((x - mean).square() * m).sum() / n)

    v_r = var(returns_BT.float())
    return 0.0 if v_r <= 1e-12 else 1.0 - var((returns_BT - values_BT).float().detach()) / v_r


def ppo_loss(logp, old_logp, advantages, mask, values, old_values, returns, *, value_clip: float, vf_coef: float,
             reduction: str = "sample", **policy_kw) -> tuple[torch.Tensor, dict]:  # fmt: skip
    """policy_loss (the clipped surrogate, `policy_kw`: eps_low, eps_high, rollout_logp, mismatch, ...) + vf_coef ·
    value_loss. All `(B, T)`; advantages per token. stats: the policy loss's (clip_frac, ratio_mean, ...) and
    policy_loss, value_loss, vf_clip_frac, values_mean, returns_mean: means, so that the loop's weighted sum over
    micro-batches is the step's (explained variance is not one: rollout_fields reports it per rollout batch)."""
    pg, stats = policy_loss(logp, old_logp, advantages, mask, reduction=reduction, **policy_kw)
    vf, vf_clip_frac = value_loss(values, old_values, returns, mask, value_clip, reduction)
    m = (mask > 0).float()
    n = m.sum().clamp(min=1)
    stats |= {"policy_loss": float(pg.detach()), "value_loss": float(vf.detach()), "vf_clip_frac": vf_clip_frac,
              "values_mean": float((values.detach() * m).sum() / n), "returns_mean": float((returns * m).sum() / n)}  # fmt: skip
    return pg + vf_coef * vf, stats


def ppo_objective(model, hidden_BTD, logp_BT, old_BT, mask_BT, batch: dict, opts) -> tuple[torch.Tensor, dict]:
    """stage.rl_loss's PPO branch: the critic's values on this forward's hidden states, the fields rollout_fields
    put into the batch, and the KL to the reference (a rollout figure, per micro-batch)."""
    loss, stats = ppo_loss(logp_BT, old_BT, batch["advantages"], mask_BT, values_of(model, hidden_BTD),
                           batch["values"], batch["returns"], value_clip=opts.value_clip, vf_coef=opts.vf_coef,
                           reduction=opts.reduction, rollout_logp=batch["rollout_logp"], eps_low=opts.eps_low,
                           eps_high=opts.eps_high, mismatch=opts.mismatch, mismatch_low=opts.mismatch_low,
                           mismatch_high=opts.mismatch_high)  # fmt: skip
    m = mask_BT.float()
    return loss, stats | {"kl": float((batch["kl"] * m).sum() / m.sum().clamp(min=1))}


# ----------------------------------------------------------------------------------------- the rollout hook


@torch.no_grad()
def rollout_fields(policy, reference, batch: dict, groups: list[torch.Tensor], temperature: float, opts):
    """What PPO adds to a rollout batch (`batch["rewards"]` (B,): the sequence rewards) -> (fields, figures).
    fields, all `(B, L)` on the CPU: old_logp (the trainer at the rollout weights), values (its critic), kl (to the
    frozen `reference`), advantages (GAE, whitened unless rl.whiten_advantages is off), returns. figures: the
    critic's explained variance of the returns over the whole batch (TRL's `explained_variance`) and the advantages'
    raw mean / std. One policy forward per group of rows: the first update's micro-batches, so that its log-probs
    and values equal these bit for bit (as rollouts.old_logprobs)."""
    device = next(dist.unwrap(policy).parameters()).device
    old, values, ref = (torch.zeros_like(batch["rollout_logp"]) for _ in range(3))
    lp = lambda logits, tgt: token_logprobs(logits.float(), tgt, temperature, opts.top_p, opts.top_k).cpu()
    for idx in groups:
        ids, tgt = batch["input_ids"][idx].to(device), batch["targets"][idx].to(device)
        out = policy(ids, **model_routes(getattr(opts, "routing_replay", "off"), batch, idx, device))
        old[idx], values[idx] = lp(out.logits, tgt), values_of(policy, out.hidden).cpu()
        ref[idx] = lp(reference(ids).logits, tgt)
    mask = batch["mask"]
    rewards, kl = kl_rewards(batch["rewards"], old, ref, mask, opts.kl_coef)
    adv, returns = gae(rewards, values, mask, opts.gamma, opts.gae_lambda)
    m = (mask > 0).float()
    n = m.sum().clamp(min=1)
    raw_mean = (adv * m).sum() / n
    figures = {"explained_variance": explained_variance(values, returns, mask), "advantages_mean": float(raw_mean),
               "advantages_std": float((((adv - raw_mean) * m).square().sum() / n).sqrt())}  # fmt: skip
    if opts.whiten_advantages:
        adv = whiten(adv, mask)
    fields = {"old_logp": old, "values": values * m, "kl": kl, "advantages": adv, "returns": returns}
    return fields, figures
