"""Auxiliary-loss-free expert balancing (Wang et al. 2024, arXiv 2408.15664; DeepSeek-V3 §2.1.2; GLM-4.5 §2.4).

After every optimizer step each MoE layer's `e_score_correction_bias` (a buffer used only to *choose* experts)
moves by  b_i += u · sign(mean(c) − c_i),  where c_i counts the tokens routed to expert i over the whole global
batch of the step (summed over micro-batches, all-reduced over data-parallel ranks, as Megatron's
`get_updated_expert_bias`). Under-loaded experts become more attractive, over-loaded ones less; u is a
schedule (GLM-4.5: 0.001 for 15T tokens, then 0). The sequence-wise aux loss (α = 1e-4) is the model's
`out.aux_loss` and is weighted in the loss, not here.

Shapes: L = MoE layers, E = routed experts; load_LE is (L, E) token counts.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

BIAS_NAME = "e_score_correction_bias"


def bias_buffers(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """(name, buffer) of every MoE layer's balancing bias, in module order (= the rows of out.expert_load)."""
    # a CogVLM visual expert's MoE copy (model/vision/visual_expert.py) keeps the bias it was copied with
    return [(n, b) for n, b in model.named_buffers() if n.endswith(BIAS_NAME) and ".visual." not in n]


def global_load(load_LE: torch.Tensor) -> torch.Tensor:
    """Sum the step's routed-token counts over data-parallel ranks (every rank then applies the same update)."""
    load_LE = load_LE.detach().float().clone()
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(load_LE)
    return load_LE


@torch.no_grad()
def update_biases(model: nn.Module, load_LE: torch.Tensor, rate: float) -> None:
    """b += rate · sign(mean load − load), per layer; `load_LE` must already be global."""
    buffers = bias_buffers(model)
    assert len(buffers) == load_LE.shape[0], f"{len(buffers)} bias buffers for {load_LE.shape[0]} MoE layers of load"
    if rate == 0:
        return
    for (_, bias_E), load_E in zip(buffers, load_LE):
        bias_E.add_(torch.sign(load_E.mean() - load_E).to(bias_E.device, bias_E.dtype), alpha=rate)


def load_metrics(load_LE: torch.Tensor) -> dict[str, float]:
    """Per layer max/mean load and load entropy (nats; log E = perfectly even), plus the worst layer."""
    frac_LE = load_LE / load_LE.sum(-1, keepdim=True).clamp(min=1)
    max_over_mean_L = load_LE.max(-1).values / load_LE.mean(-1).clamp(min=1e-9)
    entropy_L = -(frac_LE * frac_LE.clamp(min=1e-12).log()).sum(-1)
    out = {f"moe/max_over_mean/{i}": float(v) for i, v in enumerate(max_over_mean_L)}
    out |= {f"moe/entropy/{i}": float(v) for i, v in enumerate(entropy_L)}
    out["moe/max_over_mean"] = float(max_over_mean_L.max()) if len(max_over_mean_L) else 0.0
    return out
