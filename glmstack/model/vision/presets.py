"""Vision-language presets as config.json dicts: GLM-4.5V and GLM-4.1V-9B (released values) and tiny test models.

GLM-4.5V: zai-org/GLM-4.5V config.json (GLM-4.5-Air decoder, 46 layers, no MTP layer stored; 107,710,933,120
parameters in its safetensors). GLM-4.1V-9B: zai-org/GLM-4.1V-9B-Thinking config.json (GLM-4-9B-0414 decoder;
`image_token_id` 151343 in that tokenizer). The tiny presets put the image/video token ids where glmstack's own
`Tokenizer.train(texts, vocab_size)` puts them (the 36 added tokens after the BPE merges) for vocab_size 512;
a tokenizer that learned fewer merges has other ids: pass `token_ids(tokenizer)` as overrides.
"""

from __future__ import annotations

_VISION_45V = dict(depth=24, hidden_size=1536, num_heads=12, in_channels=3, image_size=336, patch_size=14,
                   temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=4096, intermediate_size=10944,
                   attention_bias=False, rms_norm_eps=1e-5, initializer_range=0.02, hidden_act="silu")
_TOKENS = dict(image_token_id=151363, video_token_id=151364, image_start_token_id=151339, image_end_token_id=151340,
               video_start_token_id=151341, video_end_token_id=151342)

GLM45V = dict(
    model_type="glm4v_moe", tie_word_embeddings=False, dtype="bfloat16", **_TOKENS,
    text_config=dict(
        vocab_size=151552, hidden_size=4096, intermediate_size=10944, moe_intermediate_size=1408,
        num_hidden_layers=46, num_attention_heads=96, num_key_value_heads=8, head_dim=128, attention_bias=True,
        use_qk_norm=False, n_routed_experts=128, n_shared_experts=1, num_experts_per_tok=8, n_group=1, topk_group=1,
        norm_topk_prob=True, routed_scaling_factor=1.0, first_k_dense_replace=1, max_position_embeddings=65536,
        rms_norm_eps=1e-5, initializer_range=0.02, pad_token_id=151329, eos_token_id=[151329, 151336, 151338],
        rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5,
                             mrope_section=[8, 12, 12])),
    vision_config=_VISION_45V,
)

GLM41V_9B = dict(
    model_type="glm4v", tie_word_embeddings=False, dtype="bfloat16",
    **{**_TOKENS, "image_token_id": 151343, "video_token_id": 151344},
    text_config=dict(
        vocab_size=151552, hidden_size=4096, intermediate_size=13696, num_hidden_layers=40, num_attention_heads=32,
        num_key_value_heads=2, max_position_embeddings=65536, rms_norm_eps=1e-5, initializer_range=0.02,
        pad_token_id=151329, eos_token_id=[151329, 151336, 151338, 151348],
        rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5,
                             mrope_section=[8, 12, 12])),
    vision_config={**_VISION_45V, "intermediate_size": 13696},
)


def tiny_token_ids(vocab_size: int = 512) -> dict:
    """The vision token ids of glmstack's Tokenizer trained to its full `vocab_size` (36 added tokens last)."""
    from glmstack.tokenizer import SPECIAL_TOKENS

    base = vocab_size - len(SPECIAL_TOKENS)
    at = {t: base + i for i, t in enumerate(SPECIAL_TOKENS)}
    return dict(image_token_id=at["<|image|>"], video_token_id=at["<|video|>"],
                image_start_token_id=at["<|begin_of_image|>"], image_end_token_id=at["<|end_of_image|>"],
                video_start_token_id=at["<|begin_of_video|>"], video_end_token_id=at["<|end_of_video|>"])


def token_ids(tokenizer) -> dict:
    """VLConfig overrides naming the vision tokens by a glmstack `Tokenizer`'s ids."""
    return dict(image_token_id=tokenizer.token_id("<|image|>"), video_token_id=tokenizer.token_id("<|video|>"),
                image_start_token_id=tokenizer.token_id("<|begin_of_image|>"),
                image_end_token_id=tokenizer.token_id("<|end_of_image|>"),
                video_start_token_id=tokenizer.token_id("<|begin_of_video|>"),
                video_end_token_id=tokenizer.token_id("<|end_of_video|>"))


_TINY_VISION = dict(depth=2, hidden_size=32, num_heads=2, in_channels=3, image_size=16, patch_size=4,
                    temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=64, intermediate_size=96,
                    attention_bias=False, rms_norm_eps=1e-5, initializer_range=0.02)
_TINY_ROPE = dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5, mrope_section=[2, 1, 1])

TINY_GLM45V = dict(
    model_type="glm4v_moe", tie_word_embeddings=False, **tiny_token_ids(512),
    text_config=dict(
        vocab_size=512, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, attention_bias=True, use_qk_norm=False,
        n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, n_group=1, topk_group=1, norm_topk_prob=True,
        routed_scaling_factor=1.0, first_k_dense_replace=1, max_position_embeddings=4096, rms_norm_eps=1e-5,
        initializer_range=0.02, rope_parameters=_TINY_ROPE),
    vision_config=_TINY_VISION,
)

TINY_GLM41V = dict(
    model_type="glm4v", tie_word_embeddings=False, **tiny_token_ids(512),
    text_config=dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096, rms_norm_eps=1e-5,
                     initializer_range=0.02, rope_parameters=_TINY_ROPE),
    vision_config=_TINY_VISION,
)

VL_PRESETS: dict[str, dict] = {
    "glm-4.5v": GLM45V,
    "glm-4.1v-9b": GLM41V_9B,
    "tiny-glm4.5v": TINY_GLM45V,
    "tiny-glm4.1v": TINY_GLM41V,
}
