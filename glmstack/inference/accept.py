"""Speculative acceptance rules: exact match (greedy) and rejection sampling (Leviathan et al. 2023, Alg. 1).

Why a separate file: this is the piece whose correctness is a theorem — the emitted tokens are distributed
exactly as the target model's sampling distribution p, whatever the draft distribution q — so it is tested
on its own on toy distributions (tests/parity/test_speculative_accept.py) before the engine uses it.

Given k drafts x_1..x_k sampled from q_1..q_k and the target distributions p_1..p_{k+1} from one verify
forward (p_j predicts the position of x_j; p_{k+1} the one after x_k):
  accept x_j with probability min(1, p_j(x_j) / q_j(x_j)) while all earlier ones were accepted;
  at the first rejection j draw the correction from norm(max(0, p_j - q_j)); if all k are accepted
  draw a bonus token from p_{k+1}.
Greedy (temperature 0) is the same rule with one-hot p and q: accept while x_j == argmax p_j, then emit
argmax p at the first mismatch. Shapes: B rows, K drafts, V vocabulary.

Randomness: the K accept tests and the final draw take K + 1 draw keys per row from the caller (the engine passes
each row's own stream, sampling.RowStreams, so a row's output does not depend on its batch), or a torch.Generator.
"""

from __future__ import annotations

import torch

from glmstack.inference.sampling import Noise, sample_from_probs, uniform_of


def accept_greedy(draft_BK: torch.Tensor, target_logits_BKV: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (n_accepted (B,), next token (B,)): drafts accepted while they equal the target argmax."""
    K = draft_BK.shape[1]
    target_BK1 = target_logits_BKV.argmax(-1)  # (B, K+1)
    match_BK = draft_BK == target_BK1[:, :K]
    n_B = match_BK.long().cumprod(1).sum(1)
    return n_B, target_BK1.gather(1, n_B[:, None]).squeeze(1)


def accept_sampled(
    draft_BK: torch.Tensor,
    q_BKV: torch.Tensor,
    p_BKV: torch.Tensor,
    noise: Noise = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (n_accepted (B,), next token (B,)) by the rejection rule; q (B, K, V), p (B, K+1, V) probabilities.

    noise: draw keys (B, K + 1) — the K accept tests, then the draw of the next token — or a generator.
    """
    B, K = draft_BK.shape
    V = p_BKV.shape[-1]
    if isinstance(noise, torch.Tensor):
        u_BK, next_noise = uniform_of(noise[:, :K]), noise[:, K]
    else:
        u_BK, next_noise = torch.rand(B, K, generator=noise, device=p_BKV.device), noise
    idx_BK1 = draft_BK[..., None]
    p_x_BK = p_BKV[:, :K].gather(-1, idx_BK1).squeeze(-1)
    q_x_BK = q_BKV.gather(-1, idx_BK1).squeeze(-1)
    accept_BK = u_BK * q_x_BK < p_x_BK  # u < p/q without dividing by a q that may underflow
    n_B = accept_BK.long().cumprod(1).sum(1)
    # distribution of the next token: residual at the first rejection, p_{k+1} when all were accepted
    at_BV = n_B[:, None, None].expand(B, 1, V)
    p_n_BV = p_BKV.gather(1, at_BV).squeeze(1)
    q_pad_BKV = torch.cat([q_BKV, q_BKV.new_zeros(B, 1, V)], dim=1)  # q = 0 after the last draft -> residual = p
    residual_BV = (p_n_BV - q_pad_BKV.gather(1, at_BV).squeeze(1)).clamp_min(0)
    mass_B1 = residual_BV.sum(-1, keepdim=True)
    # mass 0 only when p == q up to rounding, where a rejection has probability ~0; fall back to p
    residual_BV = torch.where(mass_B1 > 0, residual_BV / mass_B1.clamp_min(1e-30), p_n_BV)
    next_B = sample_from_probs(residual_BV, next_noise)
    return n_B, next_B
