"""CogVLM's visual expert (Wang et al. 2023, arXiv 2311.03079 §2.2) as a GLMV option (`VLConfig.visual_expert`).

Every decoder layer gets a second set of attention QKV projections and a second MLP (a dense SwiGLU, or a whole MoE
on a MoE layer), used by image tokens only and initialised from the language model's weights; attention itself
stays joint (image and text tokens attend to each other through the usual softmax). Image tokens also share one
position id (mrope.rope_index(flat_images=True)). With no image token in a batch the expert modules run exactly
their language-model path, so text-only inputs give bit-identical logits to the model without the expert
(tests/unit/test_vl_model.py).

How: the language model's own q/k/v projection and MLP modules become their expert subclass in place (their names
and weights unchanged), each holding its copy as `.visual` (state-dict names `...q_proj.visual.weight`,
`...mlp.visual.gate_proj.weight`: glmstack-only tensors in a saved checkpoint). Which tokens are image tokens
is read from one shared `ImageTokens` that GLMV.forward sets for the duration of a forward. Both paths are
computed for every token and selected (simple and exact; 2x the FLOPs of the wrapped layers).
"""

from __future__ import annotations

import copy

import torch
from torch import nn


class ImageTokens:
    """The (B, T, 1) bool mask of the current forward's image tokens, or None (text only)."""

    def __init__(self):
        self.mask: torch.Tensor | None = None


class VisualExpert:
    """Mixin over a module whose forward returns a tensor (Linear, MLP) or MoE's (y, aux, load, own) tuple."""

    visual: nn.Module
    image_tokens: ImageTokens

    def forward(self, x, *args):
        out = super().forward(x, *args)
        mask = self.image_tokens.mask
        if mask is None:
            return out
        vis = self.visual(x, *args)
        if isinstance(out, tuple):  # MoE: the text experts' aux loss and load are what balancing sees
            return (torch.where(mask, vis[0], out[0]), *out[1:])
        return torch.where(mask, vis, out)


_CLASSES: dict[type, type] = {}


def _expert_class(cls: type) -> type:
    if cls not in _CLASSES:
        _CLASSES[cls] = type(f"VisualExpert{cls.__name__}", (VisualExpert, cls), {})
    return _CLASSES[cls]


def make_expert(module: nn.Module, tokens: ImageTokens) -> None:
    """Turn `module` into its visual-expert subclass in place, with a copy of itself as `.visual`."""
    visual = copy.deepcopy(module)
    module.__class__ = _expert_class(type(module))
    module.visual = visual
    module.image_tokens = tokens


def add_visual_experts(language_model: nn.Module, tokens: ImageTokens) -> None:
    """Expert q/k/v projections and MLP in every decoder layer (MTP layers excluded: they see no image)."""
    for layer in language_model.layers:
        for name in ("q_proj", "k_proj", "v_proj"):
            make_expert(getattr(layer.self_attn, name), tokens)
        make_expert(layer.mlp, tokens)


@torch.no_grad()
def copy_language_into_experts(language_model: nn.Module) -> None:
    """Initialise every visual expert from the language model's weights (and MoE balancing biases)."""
    for module in language_model.modules():
        if isinstance(module, VisualExpert):
            own = {k: v for k, v in module.state_dict().items() if not k.startswith("visual.")}
            for name, t in module.visual.state_dict().items():
                t.copy_(own[name])


def expert_names(state_dict_names) -> list[str]:
    """The visual-expert tensors among state-dict names."""
    return [n for n in state_dict_names if ".visual." in n and not n.startswith("visual.")]
