"""The DSA indexer's distillation loss: KL(main attention ‖ indexer), DeepSeek-V3.2 Eq. 3–4.

Target p[t, s]: the main attention's probabilities summed over heads and L1-normalised along s (for dense
softmax that is the head average). Student: softmax of the index scores over the same allowed keys (all causal
keys in dense warm-up; only the selected top-k in sparse adaptation). Loss: KL(p ‖ q) per query row, averaged over
rows that have at least one allowed key. Matches MCORE `compute_dsa_indexer_loss` (clamp 1e-10 on the L1 norm).

Shape legend: B batch, H main heads, T queries, S keys.
"""

from __future__ import annotations

import torch


def attention_target(probs_BHTS: torch.Tensor) -> torch.Tensor:
    """Sum over heads, L1-normalise over keys -> (B, T, S); no gradient."""
    p_BTS = probs_BHTS.detach().float().sum(1)
    return p_BTS / p_BTS.sum(-1, keepdim=True).clamp_min(1e-10)


def indexer_kl(probs_BHTS: torch.Tensor, scores_BTS: torch.Tensor, mask_B1TS: torch.Tensor) -> torch.Tensor:
    """Mean over valid rows of KL(target ‖ softmax(scores over mask)); gradient flows into `scores` only."""
    p_BTS = attention_target(probs_BHTS)
    mask_BTS = mask_B1TS[:, 0].expand_as(p_BTS)
    log_q_BTS = scores_BTS.float().masked_fill(~mask_BTS, float("-inf")).log_softmax(-1)
    terms_BTS = torch.where(p_BTS > 0, p_BTS * (p_BTS.clamp_min(1e-30).log() - log_q_BTS), 0.0)
    valid_BT = mask_BTS.any(-1)
    return terms_BTS.sum(-1)[valid_BT].mean()


def topk_recall(probs_BHTS: torch.Tensor, scores_BTS: torch.Tensor, mask_B1TS: torch.Tensor, k: int) -> float:
    """Share of the main attention's top-k keys (by head-summed probability) that the indexer's top-k also picks.

    Averaged over query rows with more than k allowed keys (shorter rows are trivially fully recalled).
    """
    mask_BTS = mask_B1TS[:, 0].expand(scores_BTS.shape)
    rows_BT = mask_BTS.sum(-1) > k
    if not rows_BT.any():
        return 1.0
    neg = float("-inf")
    want_BTK = attention_target(probs_BHTS).masked_fill(~mask_BTS, neg).topk(k, -1).indices
    got_BTK = scores_BTS.detach().float().masked_fill(~mask_BTS, neg).topk(k, -1).indices
    hit_BTK = (want_BTK[..., :, None] == got_BTK[..., None, :]).any(-1)
    return hit_BTK.float().mean(-1)[rows_BT].mean().item()
