"""Configs of the GLM vision-language models: the ViT (`VisionConfig`), GLM-4.1V's dense GLM-4 decoder
(`DenseTextConfig`) and the whole model (`VLConfig`), with Hugging Face `config.json` field names.

Two HF model types: `glm4v_moe` (GLM-4.5V: the GLM-4.5-Air MoE decoder, our `ModelConfig`) and `glm4v`
(GLM-4.1V-9B: the dense GLM-4-0414 decoder with sandwich norms, `DenseTextConfig`). Both share the ViT and the 3D
RoPE split `mrope_section` (time, height, width frequency pairs; sums to rotary_dim / 2). Released values:
zai-org/GLM-4.5V and zai-org/GLM-4.1V-9B-Thinking config.json (arXiv 2507.01006); docs/multimodal.md.

    cfg = VLConfig.preset("tiny-glm4.5v")
    cfg = VLConfig.from_hf("path/to/checkpoint")     # folder, config.json path or dict
    d = cfg.to_hf()                                  # what save_vl_hf writes as config.json
"""

from __future__ import annotations

import copy
import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from glmstack.config import ConfigError, from_dict
from glmstack.model.config import HF_METADATA_KEYS, ModelConfig, read_config_json

VL_MODEL_TYPES = {"glm4v_moe": "Glm4vMoeForConditionalGeneration", "glm4v": "Glm4vForConditionalGeneration"}
TEXT_MODEL_TYPES = {"glm4v_moe": "glm4v_moe_text", "glm4v": "glm4v_text"}
TOKEN_FIELDS = ("image_token_id", "video_token_id", "image_start_token_id", "image_end_token_id",
                "video_start_token_id", "video_end_token_id")
# glmstack-only options, written to config.json only when on (so a default config.json is transformers')
GLMSTACK_FIELDS = ("visual_expert",)
# keys of a vision/text sub-config that describe the file, not the architecture
_SUB_METADATA = HF_METADATA_KEYS | {"model_type", "base_config_key"}


@dataclass(kw_only=True)
class VisionConfig:
    """The ViT of GLM-4.1V / GLM-4.5V (HF `Glm4vVisionConfig` field names)."""

    depth: int = 24  # ViT blocks
    hidden_size: int = 1536  # ViT width
    num_heads: int = 12  # ViT attention heads (head dim = hidden_size / num_heads; 2D RoPE over all of it)
    in_channels: int = 3
    image_size: int = 336  # the learned position table covers (image_size / patch_size)^2 positions
    patch_size: int = 14  # pixels per patch side
    temporal_patch_size: int = 2  # frames per patch: an image is repeated into a two-frame clip
    spatial_merge_size: int = 2  # m x m patches -> one LLM token (a stride-m conv)
    out_hidden_size: int = 4096  # the decoder's width; also the ViT MLP's width (as HF builds it)
    intermediate_size: int = 13696  # the merger (adapter) SwiGLU width
    attention_bias: bool = False  # bias on the fused qkv projection
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0  # base of the ViT's 2D RoPE
    initializer_range: float = 0.02

    def __post_init__(self):
        p = [f"vision_config.{k} must be > 0" for k in ("depth", "hidden_size", "num_heads", "in_channels",
                                                         "image_size", "patch_size", "temporal_patch_size",
                                                         "spatial_merge_size", "out_hidden_size",
                                                         "intermediate_size") if getattr(self, k) <= 0]
        if not p and (self.hidden_size % self.num_heads or (self.hidden_size // self.num_heads) % 4):
            p.append(f"vision_config.hidden_size ({self.hidden_size}) / num_heads ({self.num_heads}) must be a "
                     f"multiple of 4 (2D RoPE splits the head into h and w halves of rotate-half pairs)")
        if not p and self.image_size % self.patch_size:
            p.append(f"vision_config.image_size ({self.image_size}) must be a multiple of patch_size")
        if p:
            raise ConfigError("invalid VisionConfig: " + "; ".join(p))

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_dim(self) -> int:
        """Width of one row of pixel_values: C * temporal_patch_size * patch_size^2."""
        return self.in_channels * self.temporal_patch_size * self.patch_size**2


@dataclass(kw_only=True)
class DenseTextConfig:
    """GLM-4.1V's decoder: GLM-4-0414 (dense SwiGLU, q/k/v bias, sandwich norms, interleaved partial RoPE)."""

    vocab_size: int = 151552
    hidden_size: int = 4096
    intermediate_size: int = 13696
    num_hidden_layers: int = 40
    num_attention_heads: int = 32  # head_dim = hidden_size / num_attention_heads (HF derives it)
    num_key_value_heads: int = 2
    partial_rotary_factor: float = 0.5
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 65536
    initializer_range: float = 0.02
    tie_word_embeddings: bool = False
    hf_metadata: dict[str, Any] = field(default_factory=dict)
    fused_lm_loss: bool = True  # glmstack training field, as ModelConfig's

    def __post_init__(self):
        p = [f"text_config.{k} must be > 0" for k in ("vocab_size", "hidden_size", "intermediate_size",
                                                       "num_hidden_layers", "num_attention_heads",
                                                       "num_key_value_heads") if getattr(self, k) <= 0]
        if not p and (self.hidden_size % self.num_attention_heads
                      or self.num_attention_heads % self.num_key_value_heads):
            p.append("text_config: hidden_size must divide by num_attention_heads, and that by num_key_value_heads")
        if not p and (self.rotary_dim % 2 or self.rotary_dim <= 0):
            p.append(f"text_config.partial_rotary_factor ({self.partial_rotary_factor}) gives an odd rotary dim")
        if p:
            raise ConfigError("invalid DenseTextConfig: " + "; ".join(p))

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)


@dataclass(kw_only=True)
class VLConfig:
    """A GLM vision-language model: ViT + merger (adapter) + a text decoder with 3D RoPE."""

    model_type: str = "glm4v_moe"  # glm4v_moe (GLM-4.5V, MoE decoder) | glm4v (GLM-4.1V, dense GLM-4 decoder)
    text_config: ModelConfig | DenseTextConfig = field(default_factory=ModelConfig)
    vision_config: VisionConfig = field(default_factory=VisionConfig)
    mrope_section: list[int] = field(default_factory=lambda: [8, 12, 12])  # (t, h, w) frequency pairs
    image_token_id: int = 151363  # <|image|>: one per merged patch (GLM-4.1V's release: 151343)
    video_token_id: int = 151364  # <|video|>: the chat template's video slot (frames are written with image ids)
    image_start_token_id: int = 151339  # <|begin_of_image|>
    image_end_token_id: int = 151340  # <|end_of_image|>
    video_start_token_id: int = 151341  # <|begin_of_video|>
    video_end_token_id: int = 151342  # <|end_of_video|>
    visual_expert: bool = False  # CogVLM: per-layer expert QKV + MLP for image tokens (visual_expert.py)
    hf_metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        p = []
        if self.model_type not in VL_MODEL_TYPES:
            p.append(f"model_type {self.model_type!r} is not a vision-language type ({', '.join(VL_MODEL_TYPES)})")
        want = ModelConfig if self.model_type == "glm4v_moe" else DenseTextConfig
        if not isinstance(self.text_config, want):
            p.append(f"{self.model_type} needs a {want.__name__} text_config, got {type(self.text_config).__name__}")
        elif isinstance(self.text_config, ModelConfig) and (self.text_config.is_mla or self.text_config.position_2d
                                                            or self.text_config.use_qk_norm):
            p.append("glm4v_moe's decoder is GQA with 1D/3D RoPE (no MLA, no position_2d, no QK-Norm: "
                     "transformers' Glm4vMoe has none)")
        elif sum(self.mrope_section) * 2 != self.text_config.rotary_dim:
            p.append(f"mrope_section {self.mrope_section} must sum to rotary_dim / 2 = "
                     f"{self.text_config.rotary_dim // 2}")
        if len(self.mrope_section) != 3 or min(self.mrope_section) < 0:
            p.append(f"mrope_section must be 3 non-negative sizes (t, h, w), got {self.mrope_section}")
        if p:
            raise ConfigError("invalid VLConfig: " + "; ".join(p))

    @property
    def image_tokens_per_patch_block(self) -> int:
        """Patches merged into one LLM token: spatial_merge_size^2."""
        return self.vision_config.spatial_merge_size ** 2

    # ---------------------------------------------------------------- HF conversion
    @classmethod
    def from_hf(cls, source: str | Path | dict, **overrides) -> VLConfig:
        """Read a `glm4v_moe` / `glm4v` config.json (dict, file or folder). overrides: top-level fields, or
        `text_config` / `vision_config` dicts of fields to override there."""
        d = copy.deepcopy(source) if isinstance(source, dict) else read_config_json(source)[1]
        where = "config.json" if isinstance(source, dict) else str(source)
        model_type = d.pop("model_type", None)
        if model_type not in VL_MODEL_TYPES:
            raise ConfigError(f"{where}: model_type {model_type!r} is not one of {', '.join(VL_MODEL_TYPES)}")
        text, vision = d.pop("text_config", None), d.pop("vision_config", None)
        if not isinstance(text, dict) or not isinstance(vision, dict):
            raise ConfigError(f"{where}: a {model_type} config needs text_config and vision_config objects")
        meta = {k: d.pop(k) for k in list(d) if k in HF_METADATA_KEYS}
        tie = d.pop("tie_word_embeddings", None)
        text_over, vision_over = overrides.pop("text_config", {}), overrides.pop("vision_config", {})
        text_cfg, mrope = _text_from_hf(model_type, text, tie, text_over, where)
        data = {**d, "model_type": model_type, "text_config": text_cfg, "mrope_section": mrope,
                "vision_config": _vision_from_hf(vision, vision_over, where), "hf_metadata": meta, **overrides}
        return from_dict(cls, data)

    def to_hf(self) -> dict:
        """The config.json dict as transformers 5 writes it for Glm4vMoeForConditionalGeneration /
        Glm4vForConditionalGeneration."""
        text = self.text_config.to_hf() if isinstance(self.text_config, ModelConfig) else _dense_to_hf(self.text_config)
        for k in ("architectures", "dtype", "torch_dtype", "transformers_version"):
            text.pop(k, None)
        text["model_type"] = TEXT_MODEL_TYPES[self.model_type]
        text["rope_parameters"] = {**text.get("rope_parameters", {}), "mrope_section": list(self.mrope_section)}
        text["rope_parameters"].setdefault("rope_theta", self.text_config.rope_theta)
        text["rope_parameters"].setdefault("partial_rotary_factor", self.text_config.partial_rotary_factor)
        text["rope_parameters"]["rope_type"] = "default"
        if self.model_type == "glm4v_moe" and not text.get("num_nextn_predict_layers"):
            text.pop("num_nextn_predict_layers", None)  # the released GLM-4.5V has no MTP layer; HF has no field
        vision = {k: v for k, v in dataclasses.asdict(self.vision_config).items() if k != "rope_theta"}
        vision.update(model_type=f"{self.model_type}_vision", hidden_act="silu", attention_dropout=0.0,
                      rope_parameters={"rope_type": "axial", "rope_theta": self.vision_config.rope_theta})
        out = {"architectures": [VL_MODEL_TYPES[self.model_type]], "model_type": self.model_type,
               "text_config": text, "vision_config": vision,
               "tie_word_embeddings": self.text_config.tie_word_embeddings,
               **{k: getattr(self, k) for k in TOKEN_FIELDS}}
        out.update({k: getattr(self, k) for k in GLMSTACK_FIELDS if getattr(self, k)})
        out.update({k: v for k, v in self.hf_metadata.items() if k not in out})
        return json.loads(json.dumps(out))

    # ---------------------------------------------------------------- presets
    @classmethod
    def preset(cls, name: str, **overrides) -> VLConfig:
        from glmstack.model.vision.presets import VL_PRESETS

        if name not in VL_PRESETS:
            raise ConfigError(f"unknown vision-language preset {name!r}; presets: {', '.join(VL_PRESETS)}")
        return cls.from_hf(VL_PRESETS[name], **overrides)


def _rope_of(d: dict, where: str) -> tuple[dict, list[int]]:
    """Pop the RoPE keys of a text_config (flat legacy keys, `rope_scaling` or `rope_parameters`) -> (flat
    rope_theta / partial_rotary_factor, mrope_section)."""
    rope = {}
    for key in ("rope_scaling", "rope_parameters"):
        value = d.pop(key, None)
        if isinstance(value, dict):
            rope.update(value)
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise ConfigError(f"{where}: text_config rope_type {rope.get('rope_type')!r}: only 'default' is supported")
    flat = {k: rope[k] for k in ("rope_theta", "partial_rotary_factor") if k in rope}
    for k in ("rope_theta", "partial_rotary_factor"):
        if k in d:
            value = d.pop(k)
            if k in flat and flat[k] != value:
                raise ConfigError(f"{where}: text_config.{k}={value!r} contradicts rope_parameters.{k}={flat[k]!r}")
            flat[k] = value
    return flat, list(rope.get("mrope_section", [8, 12, 12]))


def _text_from_hf(model_type: str, text: dict, tie, overrides: dict, where: str):
    text = {k: v for k, v in text.items() if k not in ("model_type", "base_config_key")}
    for k in TOKEN_FIELDS:  # older files repeat the token ids inside text_config
        text.pop(k, None)
    flat, mrope = _rope_of(text, where)
    if tie is not None:
        text["tie_word_embeddings"] = tie
    if model_type == "glm4v_moe":
        text.setdefault("partial_rotary_factor", flat.get("partial_rotary_factor", 0.5))
        text["rope_theta"] = flat.get("rope_theta", 10000.0)  # transformers' default for these models
        text.setdefault("num_nextn_predict_layers", 0)
        text.setdefault("use_qk_norm", False)
        text["partial_rotary_factor"] = flat.get("partial_rotary_factor", text["partial_rotary_factor"])
        try:
            cfg = ModelConfig.from_hf({**text, "model_type": "glm4_moe"}, **overrides)
        except ConfigError as e:
            raise ConfigError(f"{where}: text_config: {e}") from None
        return cfg, mrope
    meta = {k: text.pop(k) for k in list(text) if k in _SUB_METADATA}
    for k, want in (("hidden_act", "silu"), ("attention_dropout", 0.0), ("attention_bias", True)):
        if k in text and text.pop(k) != want:
            raise ConfigError(f"{where}: text_config.{k} must be {want!r} for glm4v")
    text.pop("head_dim", None)  # HF derives it from hidden_size / num_attention_heads
    text.update({"partial_rotary_factor": 1.0, "rope_theta": 10000.0, **flat})  # transformers' defaults
    return from_dict(DenseTextConfig, {**text, "hf_metadata": meta, **overrides}, _prefix="text_config."), mrope


def _vision_from_hf(vision: dict, overrides: dict, where: str) -> VisionConfig:
    v = {k: val for k, val in vision.items() if k not in _SUB_METADATA}
    rope = v.pop("rope_parameters", None) or {}
    if "rope_theta" in rope:
        v.setdefault("rope_theta", rope["rope_theta"])
    for k, want in (("hidden_act", "silu"), ("attention_dropout", 0.0)):
        if k in v and v.pop(k) != want:
            raise ConfigError(f"{where}: vision_config.{k} must be {want!r}")
    return from_dict(VisionConfig, {**v, **overrides}, _prefix="vision_config.")


def _dense_to_hf(t: DenseTextConfig) -> dict:
    d = {k: v for k, v in dataclasses.asdict(t).items() if k not in ("hf_metadata", "fused_lm_loss")}
    rope = {"rope_theta": d.pop("rope_theta"), "partial_rotary_factor": d.pop("partial_rotary_factor"),
            "rope_type": "default"}
    out = {**d, "rope_parameters": rope, "hidden_act": "silu", "attention_dropout": 0.0, "attention_bias": True}
    out.update({k: v for k, v in t.hf_metadata.items() if k not in out})
    return out
