"""GLMV: GLM-4.5V / GLM-4.1V-Thinking (arXiv 2507.01006) = ViT + MLP adapter + a GLM text decoder with 3D RoPE.

The image (and video-frame) tokens the ViT returns replace the `<|image|>` placeholder embeddings in order, then
the decoder runs with M-RoPE positions (mrope.py). The decoder is glmstack's own text model (`GLM` for glm4v_moe,
`DenseGLM4` for glm4v) fed through its `inputs_embeds` / `rope` arguments; with no image or video and no 3D
positions it is called exactly as a text model, so its logits are bit-identical to the text model's
(tests/unit/test_vl_model.py). Computes what transformers' `Glm4vMoeForConditionalGeneration` /
`Glm4vForConditionalGeneration` compute (tests/parity/test_vl_hf.py).

    model = GLMV(VLConfig.preset("tiny-glm4.5v")).init_weights(seed=0)
    out = model(input_ids, labels=labels, pixel_values=pv, image_grid_thw=grid)  # pv/grid from Glm4vImageProcessor
    ids = generate(model, prompt_ids, pixel_values=pv, image_grid_thw=grid, max_new_tokens=32)

Decoding (generate, generate_batch) is the engine's: glmstack/inference/vision.py (the model imports no engine code).

`cfg.visual_expert` adds CogVLM's visual expert (visual_expert.py) and CogVLM positions (an image's tokens share
one position id).
"""

from __future__ import annotations

import torch
from torch import nn

from glmstack.model.config import ModelConfig
from glmstack.model.layers import RMSNorm
from glmstack.model.model import GLM, GLMOutput, _draw, _owner
from glmstack.model.vision.config import VLConfig
from glmstack.model.vision.dense_text import DenseGLM4
from glmstack.model.vision.encoder import VisionEncoder
from glmstack.model.vision.mrope import VisionInputError, mrope_cos_sin, rope_index, token_types
from glmstack.model.vision.visual_expert import ImageTokens, add_visual_experts, copy_language_into_experts


class GLMV(nn.Module):
    def __init__(self, cfg: VLConfig, device=None, dtype: torch.dtype | None = None):
        super().__init__()
        self.cfg = cfg
        with torch.device("meta"):
            self.visual = VisionEncoder(cfg.vision_config)
        moe = isinstance(cfg.text_config, ModelConfig)
        self.language_model = GLM(cfg.text_config) if moe else DenseGLM4(cfg.text_config)
        self.image_tokens = ImageTokens()  # which tokens the visual expert takes (set for one forward)
        if cfg.visual_expert:
            add_visual_experts(self.language_model, self.image_tokens)
        if dtype is not None:
            self.cast(dtype)
        if device is not None:
            self.init_weights(seed=0, device=device)

    # ---------------------------------------------------------------- dtype / init
    def cast(self, dtype: torch.dtype) -> GLMV:
        """Everything to dtype except the MoE routers and balancing biases (fp32, as GLM.cast)."""
        if isinstance(self.language_model, GLM):
            self.language_model.cast(dtype)
        else:
            self.language_model.to(dtype)
        self.visual.to(dtype)
        return self

    def materialize(self, device) -> GLMV:
        if any(t.is_meta for t in self.state_dict().values()):
            self.to_empty(device=device)
            lm = self.language_model
            if lm.cfg.tie_word_embeddings:
                lm.lm_head.weight = lm.embed_tokens.weight
        return self

    @torch.no_grad()
    def init_weights(self, seed: int = 0, device=None) -> GLMV:
        """The text model as GLM.init_weights (seed), the ViT as transformers' _init_weights (seed + 1): matrices
        and the position table N(0, initializer_range), biases 0, norm gains 1; the visual expert a copy of the
        language model's weights (CogVLM)."""
        self.materialize(device or "cpu")
        state = self.state_dict()
        for name, full in self.initial_tensors(seed, state[next(iter(state))].device):
            state[name].copy_(full)
        if self.cfg.visual_expert:
            copy_language_into_experts(self.language_model)
        return self

    def initial_tensors(self, seed: int = 0, device="cpu"):
        """(state-dict name, initial tensor) of every tensor, one at a time (visual-expert copies excluded: the same
        seed gives the same weights with or without the expert)."""
        lm = self.language_model
        if isinstance(lm, GLM):
            plain = GLM(self.cfg.text_config) if self.cfg.visual_expert else lm  # a meta twin without experts
            yield from (("language_model." + n, t) for n, t in plain.initial_tensors(seed, device))
        else:
            yield from _draw(_plan(lm, "language_model.", self.cfg.text_config.initializer_range), 1.0, seed, device)
        yield from _draw(_plan(self.visual, "visual.", self.cfg.vision_config.initializer_range), 1.0, seed + 1,
                         device)

    # ---------------------------------------------------------------- forward
    def forward(self, input_ids, labels=None, pixel_values=None, image_grid_thw=None, pixel_values_videos=None,
                video_grid_thw=None, position_ids=None, segment_ids=None, cache=None, mtp_weight=None,
                aux_loss_weight=None, attention_mask=None, mm_token_type_ids=None) -> GLMOutput:
        """input_ids (B, T) with each image written as its run of image_token_id placeholders (placeholders.py);
        pixel_values (N_patches, patch_dim) and image_grid_thw (N_images, 3) as Glm4vImageProcessor returns them,
        images in the order their runs appear (row by row); videos alike (frames written with image tokens inside
        <|begin_of_video|>..<|end_of_video|>). labels ALREADY SHIFTED (docs/CONTRACTS.md). position_ids: None
        (computed: 3D with vision input, else 1D), (B, T) 1D (decoding after a prefill: next_position + step) or
        (3, B, T). segment_ids: packed documents (3D positions restart per segment). attention_mask (B, T) and
        mm_token_type_ids, as Glm4vProcessor returns them, are accepted too: a padded mask becomes segment_ids
        (padding = segment 0, so `model(**processor_output)` works; left padding as transformers). -> GLMOutput."""
        cfg, lm = self.cfg, self.language_model
        if attention_mask is not None and segment_ids is None and not bool(attention_mask.all()):
            segment_ids = attention_mask.long()
        has_vision = pixel_values is not None or pixel_values_videos is not None
        types_BT = None
        if has_vision or cfg.visual_expert:
            types_BT = token_types(input_ids, cfg) if mm_token_type_ids is None else mm_token_type_ids
        if not has_vision and (position_ids is None or position_ids.dim() == 2) and not cfg.visual_expert:
            return lm(input_ids, labels=labels, position_ids=position_ids, segment_ids=segment_ids, cache=cache,
                      mtp_weight=mtp_weight, aux_loss_weight=aux_loss_weight)  # the text model, untouched
        embeds = lm.embed(input_ids)
        if pixel_values is not None:
            embeds = self._scatter(embeds, types_BT == 1, pixel_values, image_grid_thw, "image")
        if pixel_values_videos is not None:
            embeds = self._scatter(embeds, types_BT == 2, pixel_values_videos, _frames(video_grid_thw), "video")
        if position_ids is None:
            if cache is not None and cache.seq_len:
                raise ValueError("decoding with a KV cache needs position_ids (next_position + step, see generate)")
            position_ids, _ = rope_index(input_ids, cfg, image_grid_thw, video_grid_thw, segment_ids, types_BT,
                                         flat_images=cfg.visual_expert)
        rope = None
        if position_ids.dim() == 3:
            rope = self.rope(position_ids, embeds.dtype)
            position_ids = position_ids[0]
        self.image_tokens.mask = (types_BT != 0)[..., None] if cfg.visual_expert and bool((types_BT != 0).any()) \
            else None
        try:
            return lm(input_ids, labels=labels, position_ids=position_ids, segment_ids=segment_ids, cache=cache,
                      mtp_weight=mtp_weight, aux_loss_weight=aux_loss_weight, inputs_embeds=embeds, rope=rope)
        finally:
            self.image_tokens.mask = None

    def rope(self, position_ids_3BT, dtype):
        """M-RoPE (cos, sin) (B, T, rotary_dim) in the layout of the decoder's RoPE."""
        t = self.cfg.text_config
        return mrope_cos_sin(position_ids_3BT, t.rotary_dim, t.rope_theta, self.cfg.mrope_section, dtype,
                             interleave=isinstance(self.language_model, DenseGLM4))

    def _scatter(self, embeds_BTD, where_BT, pixels, grid_thw, kind: str):
        if grid_thw is None:
            raise VisionInputError(f"{kind} pixels given without {kind}_grid_thw")
        feats_ND = self.visual(pixels.to(embeds_BTD.device), grid_thw).to(embeds_BTD.dtype)
        n = int(where_BT.sum())
        if n != feats_ND.shape[0]:
            raise VisionInputError(f"{kind} tokens and {kind} features do not match: {n} placeholder tokens in the "
                                   f"text, {feats_ND.shape[0]} tokens from {kind}_grid_thw {grid_thw.tolist()}")
        return embeds_BTD.masked_scatter(where_BT[..., None], feats_ND)

    # ---------------------------------------------------------------- accounting
    def num_params(self, part: str | None = None) -> int:
        """Parameters (tied ones once); part: "visual" (ViT + merger), "language_model" or None (all)."""
        seen, total = set(), 0
        for name, p in self.named_parameters():
            if (part is None or name.startswith(part + ".")) and id(p) not in seen:
                seen.add(id(p))
                total += p.numel()
        return total


def _frames(video_grid_thw):
    """A video's (t, h, w) grid as t frames of (1, h, w): the ViT sees each frame as one image (as HF)."""
    if video_grid_thw is None:
        return None
    ones = video_grid_thw.new_ones(int(video_grid_thw[:, 0].sum()), 1)
    return torch.cat([ones, video_grid_thw[:, 1:].repeat_interleave(video_grid_thw[:, 0], dim=0)], dim=1)


def _plan(module: nn.Module, prefix: str, std: float):
    """transformers' init rules: norm gains 1, biases 0, every other tensor N(0, std) (names sorted)."""
    plan = []
    for name, p in sorted(module.named_parameters(), key=lambda kv: kv[0]):
        if ".visual." in name:  # visual-expert copies: filled from the language model's after
            continue
        owner = _owner(module, name)
        if isinstance(owner, (RMSNorm, nn.LayerNorm)) and not name.endswith(".bias"):
            rule = "ones"
        else:
            rule = "zeros" if name.endswith(".bias") else "normal"
        plan.append((prefix + name, p.shape, p.dtype, rule, std))
    return plan
