"""GLM-4.7-Flash (`glm4_moe_lite`): the preset is the released config, HF dict in/out, one clear error per bad
field, MLA without an indexer, and the sizes counted on the meta device."""

import dataclasses

import pytest
from reference import reference_file

from glmstack.config import ConfigError
from glmstack.model import GLM, ModelConfig
from glmstack.model.mla import MLAttention

RELEASED = reference_file("configs", "glm-4.7-flash.json")


def test_preset_is_the_released_config():
    preset = ModelConfig.preset("glm-4.7-flash")
    assert (preset.hidden_size, preset.num_hidden_layers, preset.n_routed_experts, preset.q_lora_rank) == (
        2048, 47, 64, 768)
    assert preset.hf_metadata["eos_token_id"] == [154820, 154827, 154829]
    released = ModelConfig.from_hf(RELEASED)
    assert dataclasses.replace(released, hf_metadata={}) == dataclasses.replace(preset, hf_metadata={})


def test_released_config_round_trips():
    import json

    raw = json.loads(RELEASED.read_text())
    cfg = ModelConfig.from_hf(raw)
    d = cfg.to_hf()
    assert ModelConfig.from_hf(d) == cfg
    assert d["architectures"] == ["Glm4MoeLiteForCausalLM"] and d["model_type"] == "glm4_moe_lite"
    assert d["mlp_layer_types"] == ["dense"] + ["sparse"] * 46 and d["rope_parameters"]["rope_theta"] == 1000000
    assert not {"index_topk", "indexer_types", "use_qk_norm", "mtp_loss_weight"} & set(d)
    # every released architecture key is written back with its value (RoPE inside rope_parameters, as transformers 5)
    # (topk_method/scoring_func/rope_scaling: fixed keys, accepted with their only supported value, not written)
    dropped = {"rope_theta", "partial_rotary_factor", "rope_scaling", "topk_method", "scoring_func"}
    assert {k: v for k, v in raw.items() if k not in dropped and d.get(k) != v} == {}


@pytest.mark.parametrize("change,field", [
    ({"mlp_layer_types": ["dense", "dense", "sparse"]}, "first_k_dense_replace"),  # tiny: first_k_dense_replace 1
    ({"mlp_layer_types": ["sparse", "dense", "sparse"]}, "mlp_layer_types"),
    ({"qk_head_dim": 99}, "qk_head_dim"),
    ({"rope_parameters": {"rope_theta": 1e4, "partial_rotary_factor": 0.5}}, "partial_rotary_factor"),
    ({"num_key_value_heads": 2}, "num_key_value_heads"),
    ({"kv_lora_rank": 0}, "kv_lora_rank"),
    ({"q_lora_rank": 0}, "q_lora_rank"),
    ({"index_topkk": 8}, "index_topkk"),
    ({"scoring_func": "softmax"}, "scoring_func"),
])
def test_bad_fields_name_themselves(change, field):
    d = {**ModelConfig.preset("tiny-glm47-flash").to_hf(), **change}
    with pytest.raises(ConfigError, match=field):
        ModelConfig.from_hf(d)


def test_dense_prefix_from_mlp_layer_types_alone():
    d = ModelConfig.preset("tiny-glm47-flash").to_hf()
    del d["first_k_dense_replace"]
    d["mlp_layer_types"] = ["dense", "dense", "sparse"]
    assert ModelConfig.from_hf(d).first_k_dense_replace == 2


def test_glm5_still_needs_the_query_latent():
    with pytest.raises(ConfigError, match="q_lora_rank"):
        ModelConfig.preset("tiny-glm5", q_lora_rank=None)


@pytest.mark.parametrize("q_lora_rank", [32, None])
def test_attention_is_mla_without_indexer(q_lora_rank):
    model = GLM(ModelConfig.preset("tiny-glm47-flash", q_lora_rank=q_lora_rank))
    attns = model.attentions()
    assert all(type(a) is MLAttention and a.indexer is None and not a.dsa for a in attns)
    names = {n.split("self_attn.")[1] for n, _ in model.named_parameters() if "layers.0.self_attn." in n}
    q = {"q_proj.weight"} if q_lora_rank is None else {"q_a_proj.weight", "q_a_layernorm.weight", "q_b_proj.weight"}
    assert names == q | {"kv_a_proj_with_mqa.weight", "kv_a_layernorm.weight", "kv_b_proj.weight", "o_proj.weight"}
    assert set(attns[0].muon_blocks()) == {next(iter(q - {"q_a_proj.weight", "q_a_layernorm.weight"})),
                                           "kv_b_proj.weight", "kv_a_proj_with_mqa.weight"}


def test_sizes_on_meta():
    """zai-org calls it 30B-A3B: 29.94B without the MTP layer; 3.26B active without embedding and head."""
    model = GLM(ModelConfig.preset("glm-4.7-flash"))
    assert model.num_params() == 30_587_097_088  # trunk + MTP layer (its embedding/head are the main ones)
    assert model.num_params(include_mtp=False) == 29_943_390_976  # = transformers' Glm4MoeLiteForCausalLM
    assert model.num_params(active=True, include_mtp=False, include_embeddings=False) == 3_262_374_656
    assert model.num_params(active=True, include_mtp=False) == 3_896_763_136
    assert model.kv_cache_bytes_per_token(include_mtp=False) == 47 * (512 + 64) * 2  # 54,144 B, bf16


def test_training_loss_reaches_every_parameter():
    """LM + MTP + balance loss through MLA and the MoE: every parameter gets a finite, non-zero gradient."""
    import torch

    model = GLM(ModelConfig.preset("tiny-glm47-flash")).init_weights(seed=0)
    ids = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(0))
    labels = torch.cat([ids[:, 1:], torch.full_like(ids[:, :1], -100)], dim=1)
    out = model(ids, labels=labels)
    assert len(out.mtp_loss) == 1 and out.indexer_loss is None and out.expert_load.shape == (3, 8)
    out.loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name
