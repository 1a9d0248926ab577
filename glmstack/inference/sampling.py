"""Token sampling: temperature, top-k, top-p (nucleus), greedy, all batched and seeded.

Why: the engine, MTP speculative decoding and RL rollouts must agree on ONE definition of "the sampling
distribution" — speculative rejection sampling only preserves the output distribution if the draft
distribution q and the target distribution p come from the same transform (Leviathan et al. 2023).
So `probs()` is the single place that turns logits into the distribution we sample from; `sample()` and
the speculative acceptance rule both call it.

Order of the transforms follows transformers' generate(): temperature, then top-k, then top-p. Temperature
0 means greedy (argmax), which is what `probs()` returns as a one-hot so the rejection rule degenerates to
exact match.

    from glmstack.inference.sampling import SamplingParams, sample
    g = torch.Generator().manual_seed(0)
    next_ids = sample(logits_BV, SamplingParams(temperature=0.7, top_p=0.9), g)   # (B,)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(kw_only=True, frozen=True)
class SamplingParams:
    temperature: float = 1.0  # 0 = greedy (argmax)
    top_k: int = 0  # keep the k most likely tokens; 0 = off
    top_p: float = 1.0  # keep the smallest set whose mass reaches top_p; 1.0 = off

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def filter_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, top-k, top-p on (..., V) logits; removed tokens get -inf. Float32 out."""
    x = logits.float() / params.temperature
    V = x.shape[-1]
    if 0 < params.top_k < V:
        kth = torch.topk(x, params.top_k, dim=-1).values[..., -1:]  # (..., 1)
        x = x.masked_fill(x < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1, descending=True)
        p_sorted = torch.softmax(sorted_x, dim=-1)
        mass_before = torch.cumsum(p_sorted, dim=-1) - p_sorted  # mass of strictly more likely tokens
        # Same rule as transformers' TopPLogitsWarper: drop a token once the ones above it reach top_p;
        # the most likely token always stays.
        drop_sorted = mass_before >= params.top_p
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        x = x.masked_fill(drop, float("-inf"))
    return x


def probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution we sample from, (..., V) float32; one-hot on the argmax when greedy."""
    if params.greedy:
        idx = logits.argmax(dim=-1, keepdim=True)
        return torch.zeros(logits.shape, dtype=torch.float32, device=logits.device).scatter_(-1, idx, 1.0)
    return torch.softmax(filter_logits(logits, params), dim=-1)


def sample_from_probs(p: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One draw per row of (..., V) probabilities -> (...) long."""
    flat = p.reshape(-1, p.shape[-1])
    out = torch.multinomial(flat, 1, generator=generator)  # (N, 1)
    return out.view(p.shape[:-1])


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None) -> torch.Tensor:
    """Next token per row of (..., V) logits -> (...) long. Greedy skips the softmax entirely."""
    if params.greedy:
        return logits.argmax(dim=-1)
    return sample_from_probs(probs(logits, params), generator)
