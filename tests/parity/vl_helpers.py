"""Shared helpers for the vision-language parity tests: tiny random VL configs, transformers' model with every
tensor random, images of several sizes through transformers' Glm4vImageProcessorPil, and prompts with their
image placeholder runs."""

from __future__ import annotations

import numpy as np
import torch

from glmstack.model.vision import VLConfig, expand_placeholders, token_types

from hf_helpers import randomise_

# tiny configs covering: MoE (n_group > 1, 2 dense layers, tied) and dense GLM-4 decoders, ViT with qkv bias,
# uneven M-RoPE sections
VL_CASES = {
    "moe": ("tiny-glm4.5v", {}),
    "moe_groups_tied": ("tiny-glm4.5v", dict(
        text_config=dict(n_routed_experts=8, n_group=4, topk_group=2, num_experts_per_tok=3, first_k_dense_replace=2,
                         tie_word_embeddings=True, use_qk_norm=False),
        vision_config=dict(attention_bias=True, depth=1))),
    "dense": ("tiny-glm4.1v", {}),
    "dense_sections": ("tiny-glm4.1v", dict(mrope_section=[1, 2, 1], vision_config=dict(num_heads=4))),
}
# raw image sizes (h, w): small, wide, tall, odd, square; resized by the processor to multiples of 8 pixels
IMAGE_SIZES = [(40, 24), (16, 48), (56, 20), (33, 21), (32, 32)]


def vl_config(case: str, **extra) -> VLConfig:
    preset, over = VL_CASES[case]
    return VLConfig.preset(preset, **{**over, **extra})


def hf_vl_model(cfg: VLConfig, seed: int = 0):
    import transformers

    names = {"glm4v_moe": ("Glm4vMoeConfig", "Glm4vMoeForConditionalGeneration"),
             "glm4v": ("Glm4vConfig", "Glm4vForConditionalGeneration")}[cfg.model_type]
    config_cls, model_cls = (getattr(transformers, n) for n in names)
    torch.manual_seed(seed)
    model = model_cls(config_cls(**cfg.to_hf())).eval()
    randomise_(model)
    return model


def processor(cfg: VLConfig, min_side: int = 16, max_side: int = 48):
    """transformers' image processor for cfg's ViT, resizing to between min_side^2 and max_side^2 pixels."""
    from transformers import Glm4vImageProcessorPil

    vc = cfg.vision_config
    return Glm4vImageProcessorPil(patch_size=vc.patch_size, temporal_patch_size=vc.temporal_patch_size,
                                  merge_size=vc.spatial_merge_size,
                                  size={"shortest_edge": 2 * min_side**2, "longest_edge": 2 * max_side**2})


def images(sizes, seed: int = 0):
    from PIL import Image

    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in sizes]


def image_batch(cfg: VLConfig, per_row: list[list[tuple[int, int]]], seed: int = 0, proc=None):
    """Rows of text with the given images in them (placeholders expanded, rows padded with text to one length)
    -> (input_ids (B, T), pixel_values, image_grid_thw). proc: an image processor (default `processor(cfg)`)."""
    flat = [s for row in per_row for s in row]
    feats = (proc or processor(cfg))(images=images(flat, seed), return_tensors="pt")
    grid = feats["image_grid_thw"]
    gen = torch.Generator().manual_seed(seed)
    text = lambda n: torch.randint(0, 300, (n,), generator=gen).tolist()  # below the special-token ids
    rows, k = [], 0
    for row in per_row:
        ids = text(5)
        for _ in row:
            ids += [cfg.image_start_token_id, cfg.image_token_id, cfg.image_end_token_id] + text(4)
        rows.append(expand_placeholders(ids, cfg, grid[k:k + len(row)]))
        k += len(row)
    T = max(len(r) for r in rows)
    ids = torch.tensor([r + text(T - len(r)) for r in rows])
    return ids, feats["pixel_values"], grid


def hf_logits(hf, cfg: VLConfig, ids, **vision):
    with torch.no_grad():
        return hf(input_ids=ids, mm_token_type_ids=token_types(ids, cfg), **vision).logits
