"""Perplexity by token position: how much a model gains from context, position by position.

A model that uses its context well predicts token t better the larger t is; after a context extension
(GLM-4.5 mid-training raises the RoPE base and trains on longer sequences, arXiv 2508.06471 §3.2) the curve
should keep falling past the pre-training length instead of turning up. The numbers come from one plain
forward pass per batch of held-out sequences through the model API in docs/CONTRACTS.md (`out.logits`).

    nll = loss_by_position(model, sequences)            # (T-1,) mean negative log-likelihood per position
    ppl = perplexity_by_position(model, sequences)      # exp of the above
    edges, means = position_buckets(nll, n_buckets=8)   # for a table or a short plot
    seqs = heldout_windows("runs/data/pretrain/eval", seq_len=1024, n=64)   # windows of held-out shards
"""

from __future__ import annotations

import math
from itertools import pairwise

import torch
import torch.nn.functional as F


def heldout_windows(folder, seq_len: int, n: int) -> torch.Tensor:
    """`n` windows of `seq_len` tokens spread evenly over a token-shard split (glmstack.data.shards) -> (n, seq_len).

    Windows cross document boundaries like the pre-training stream does; fewer come back when the split is short.
    """
    from glmstack.data.shards import TokenShards

    shards = TokenShards(folder)
    room = shards.n_tokens - seq_len
    if room < 0:
        raise ValueError(f"{folder}: {shards.n_tokens} tokens, fewer than one window of {seq_len}")
    n = min(n, room // seq_len + 1)
    starts = [round(i * room / max(n - 1, 1)) for i in range(n)]
    return torch.stack([torch.from_numpy(shards.span(s, s + seq_len)) for s in starts])


@torch.no_grad()
def loss_by_position(model, sequences: torch.Tensor, batch_size: int = 8) -> torch.Tensor:
    """Mean next-token NLL at each position of `sequences` (N, T) -> (T-1,); entry t scores token t+1.

    Positions whose target is negative (padding marked -100) are left out of the mean.
    """
    if sequences.dim() != 2 or sequences.size(1) < 2:
        raise ValueError(f"sequences must be (N, T) with T >= 2, got {tuple(sequences.shape)}")
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    total = torch.zeros(sequences.size(1) - 1, dtype=torch.float64)
    count = torch.zeros_like(total)
    for start in range(0, sequences.size(0), batch_size):
        batch = sequences[start : start + batch_size].to(device)  # (B, T)
        inputs, targets = batch[:, :-1].clamp(min=0), batch[:, 1:]
        logits = model(inputs).logits.float()  # (B, T-1, V)
        nll = F.cross_entropy(logits.transpose(1, 2), targets.clamp(min=0), reduction="none")  # (B, T-1)
        valid = targets >= 0
        total += (nll * valid).sum(0).double().cpu()
        count += valid.sum(0).double().cpu()
    model.train(was_training)
    return (total / count.clamp(min=1)).float()


def perplexity_by_position(model, sequences: torch.Tensor, batch_size: int = 8) -> torch.Tensor:
    """exp(loss_by_position): perplexity at each position (T-1,)."""
    return loss_by_position(model, sequences, batch_size).exp()


def position_buckets(nll: torch.Tensor, n_buckets: int = 8) -> tuple[list[int], list[float]]:
    """Average a per-position curve over `n_buckets` equal spans: (start position of each span, mean NLL)."""
    n = nll.numel()
    n_buckets = max(1, min(n_buckets, n))
    edges = [math.floor(i * n / n_buckets) for i in range(n_buckets + 1)]
    means = [nll[a:b].mean().item() for a, b in pairwise(edges)]
    return edges[:-1], means
