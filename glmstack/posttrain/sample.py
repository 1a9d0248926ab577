"""One rollout as every RL path trains on it, and the one collate that turns rollouts into the loop's micro-batches.

Why one: reasoning RL (`rl/rollouts.py`: a prompt and one sampled response), agentic RL (`agentic/`: a multi-turn
episode, model turns between environment replies), distillation and VL RL all feed the same loss
(`rl.stage.rl_loss`), which reads `input_ids`, `targets`, `mask`, `rollout_logp`, `advantages` (and `old_logp`,
`teacher_logp`, pixels where they apply). Each path used to tensorise its own way; now each produces `Sample`s and
`collate` lays them out once (tokens in, tokens out: never re-tokenised, the sampler's log-probs never re-scored).

    s = Sample(tokens=prompt + response, loss_mask=[0] * len(prompt) + [1] * len(response),
               rollout_logp=[0.0] * len(prompt) + sampler_logprobs, versions=[7])
    batch = collate(samples, advantages)            # (B, L) tensors, L = the longest sample over all ranks

Layout: row i holds sample i's tokens[:-1] as `input_ids` and tokens[1:] as `targets`, right-padded to L; `mask` is 1
where the target is one of the policy's own sampled tokens; `rollout_logp` is the sampler's log-prob of that target.
When any sample carries the rollout engine's `routes` (routing replay, docs/rl.md), the batch also has `routes`
(B, L, n trunk MoE layers, K) long: position t = the experts input token t was routed to, -1 where unknown or padding.
One L over every rank (an all-reduce), so the loop gives every micro-batch the same weight and a sample-mean
reduction stays exact under accumulation and data parallelism.

Segments (agentic context management, agentic/context.py): a sample whose context was folded mid-episode holds
several segments, each a context the sampler saw followed by the turns it sampled there; `segments` lists their start
offsets. When any sample of a batch has more than one, the batch also carries `segment_ids` (1, 2, ... per segment,
0 on padding) and `position_ids` (restarting at 0 in each segment) for the inputs, so attention never crosses
segments and each turn is scored under exactly its own context; a sample stays one row (one advantage, one
sample-mean). A segment starts with context tokens (mask 0), so no trained target crosses a boundary.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import torch

from glmstack.train import dist


@dataclass
class Sample:
    """One rollout: every id the policy saw or produced, which of them it sampled, with what log-prob and weights."""

    tokens: list[int]  # prompt, then each generated turn and the context between turns
    loss_mask: list[int]  # 1 = the policy's own sampled token (trained), 0 = prompt / environment context
    rollout_logp: list[float]  # the sampler's log-prob of each token under its sampling transform (0 off the mask)
    versions: list[int] = field(default_factory=list)  # weight version (trainer step) of each generated turn
    group: int = 0  # GRPO group (a task id)
    index: int = 0  # position in the group
    reward: float = 0.0
    status: str = "done"
    meta: dict = field(default_factory=dict)
    media: Any = None  # a VL prompt's pixels (multimodal.processor.Media)
    # (n <= len(tokens), L, K) int: the experts each trunk MoE layer routed tokens[t] to in the rollout engine (t < n;
    # -1 = unknown), GenerationResult.routes; None = not recorded
    routes: torch.Tensor | None = None
    segments: list[int] = field(default_factory=list)  # start offsets of the segments ([] or [0]: one)

    def __post_init__(self):
        if not (len(self.tokens) == len(self.loss_mask) == len(self.rollout_logp)):
            raise ValueError(f"a sample's tokens ({len(self.tokens)}), loss mask ({len(self.loss_mask)}) and rollout "
                             f"log-probs ({len(self.rollout_logp)}) must line up")  # fmt: skip
        if self.routes is not None and (self.routes.dim() != 3 or self.routes.shape[0] > len(self.tokens)):
            raise ValueError(f"a sample's routes {tuple(self.routes.shape)} must be (n <= {len(self.tokens)} tokens, "
                             "MoE layers, K)")  # fmt: skip
        s = self.segments
        if s and (s[0] != 0 or sorted(set(s)) != s or s[-1] >= len(self.tokens)):
            raise ValueError(f"a sample's segment starts must be increasing from 0 inside its tokens (got {s})")
        if any(self.loss_mask[k] for k in s):
            raise ValueError("a segment must start with context (mask 0): a trained target would cross segments")

    @classmethod
    def single_turn(cls, prompt: list[int], response: list[int], logprobs: list[float], **kw) -> Sample:
        """A prompt and one sampled response (reasoning RL, distillation, VL RL)."""
        return cls(tokens=list(prompt) + list(response), loss_mask=[0] * len(prompt) + [1] * len(response),
                   rollout_logp=[0.0] * len(prompt) + [float(x) for x in logprobs], **kw)  # fmt: skip


def collate(samples: list[Sample], advantages: torch.Tensor) -> dict:
    """The samples as one batch of `(B, L)` tensors (see the module docstring) with their `advantages (B,)`."""
    n = len(samples)
    L = dist.max_over_ranks(max(len(s.tokens) for s in samples) - 1)  # one length on every rank
    ids, tgt = torch.zeros(n, L, dtype=torch.long), torch.zeros(n, L, dtype=torch.long)
    mask, rlp = torch.zeros(n, L), torch.zeros(n, L)
    for i, s in enumerate(samples):
        k = len(s.tokens) - 1
        ids[i, :k], tgt[i, :k] = torch.tensor(s.tokens[:-1]), torch.tensor(s.tokens[1:])
        mask[i, :k] = torch.tensor(s.loss_mask[1:], dtype=torch.float32)  # target t + 1 is a sampled token
        rlp[i, :k] = torch.tensor(s.rollout_logp[1:], dtype=torch.float32)
    out = {"input_ids": ids, "targets": tgt, "mask": mask, "rollout_logp": rlp, "advantages": advantages}
    if any(len(s.segments) > 1 for s in samples):
        out["segment_ids"], out["position_ids"] = segment_layout(samples, L)
    return out | ({"routes": collate_routes(samples, L)} if any(s.routes is not None for s in samples) else {})


def collate_routes(samples: list[Sample], L: int) -> torch.Tensor:
    """(B, L, n MoE layers, K) long aligned with input_ids (tokens[:-1]): each sample's routes, -1 elsewhere."""
    _, n_layers, K = next(s.routes for s in samples if s.routes is not None).shape
    out = torch.full((len(samples), L, n_layers, K), -1, dtype=torch.long)
    for i, s in enumerate(samples):
        if s.routes is not None:
            k = min(s.routes.shape[0], len(s.tokens) - 1)  # the last token is never an input
            out[i, :k] = s.routes[:k]
    return out


def segment_layout(samples: list[Sample], L: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(segment_ids, position_ids), (B, L) each, of the samples' inputs (tokens[:-1]); see the module docstring."""
    seg, pos = torch.zeros(len(samples), L, dtype=torch.long), torch.zeros(len(samples), L, dtype=torch.long)
    for i, s in enumerate(samples):
        bounds = [*(s.segments or [0]), len(s.tokens) - 1]
        for j, (a, b) in enumerate(pairwise(bounds)):
            seg[i, a:b], pos[i, a:b] = j + 1, torch.arange(b - a)
    return seg, pos
