"""ModelConfig: released presets, HF dict in/out (transformers 5 form), one clear error per bad field."""

import json

import pytest
from reference import reference_file

from glmstack.config import ConfigError
from glmstack.model import ModelConfig

ARCH_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers",
             "num_attention_heads", "num_key_value_heads", "head_dim", "partial_rotary_factor", "rope_theta",
             "rms_norm_eps", "attention_bias", "use_qk_norm", "n_routed_experts", "n_shared_experts",
             "num_experts_per_tok", "n_group", "topk_group", "norm_topk_prob", "routed_scaling_factor",
             "first_k_dense_replace", "num_nextn_predict_layers", "tie_word_embeddings", "max_position_embeddings")


@pytest.mark.parametrize("name", ["glm-4.5", "glm-4.5-air", "glm-4.6", "glm-4.7"])
def test_presets_equal_released_configs(name):
    cfg = ModelConfig.preset(name)
    assert cfg.hf_metadata["eos_token_id"] == [151329, 151336, 151338]
    released = ModelConfig.from_hf(reference_file("configs", f"{name}.json"))
    for key in ARCH_KEYS:
        assert getattr(cfg, key) == getattr(released, key), key


def test_released_values_spot_check():
    big, air = ModelConfig.preset("glm-4.5"), ModelConfig.preset("glm-4.5-air")
    assert (big.hidden_size, big.num_hidden_layers, big.n_routed_experts, big.routed_scaling_factor) == (5120, 92, 160, 2.5)
    assert (air.hidden_size, air.num_hidden_layers, air.use_qk_norm, air.first_k_dense_replace) == (4096, 46, False, 1)
    assert ModelConfig.preset("glm-4.7").max_position_embeddings == 202752


def test_transformers_to_dict_round_trip():
    transformers = pytest.importorskip("transformers")
    cfg = ModelConfig.preset("glm-4.5")
    hf = transformers.Glm4MoeConfig(**cfg.to_hf()).to_dict()  # what save_pretrained writes (rope_parameters form)
    back = ModelConfig.from_hf(hf)
    assert all(getattr(back, k) == getattr(cfg, k) for k in ARCH_KEYS)
    assert back.to_hf()["rope_parameters"] == {"rope_theta": 1000000, "partial_rotary_factor": 0.5,
                                                "rope_type": "default"}


def test_to_hf_leaves_out_training_fields():
    d = ModelConfig.preset("tiny", mtp_loss_weight=0.1).to_hf()
    assert "mtp_loss_weight" not in d and "use_grouped_mm" not in d and "rope_theta" not in d
    assert d["model_type"] == "glm4_moe" and d["architectures"] == ["Glm4MoeForCausalLM"]


def test_old_style_top_level_rope_and_metadata_accepted():
    d = json.loads(json.dumps(ModelConfig.preset("tiny").to_hf()))
    rope = d.pop("rope_parameters")
    d.update(rope_theta=rope["rope_theta"], partial_rotary_factor=0.25, rope_scaling=None, torch_dtype="bfloat16",
             transformers_version="4.54.0", use_cache=True, num_mtp_layers=1)
    cfg = ModelConfig.from_hf(d)
    assert cfg.partial_rotary_factor == 0.25 and cfg.hf_metadata["torch_dtype"] == "bfloat16"


@pytest.mark.parametrize("change,field", [
    ({"hidden_sise": 64}, "hidden_sise"),
    ({"num_key_value_heads": 3}, "num_key_value_heads"),
    ({"n_group": 4, "topk_group": 5}, "topk_group"),
    ({"n_routed_experts": 10, "n_group": 4}, "n_routed_experts"),
    ({"num_experts_per_tok": 9}, "num_experts_per_tok"),
    ({"first_k_dense_replace": 7}, "first_k_dense_replace"),
    ({"partial_rotary_factor": 0.3}, "partial_rotary_factor"),  # contradicts rope_parameters
    ({"rope_parameters": {"rope_theta": 1e4, "partial_rotary_factor": 0.1875}}, "partial_rotary_factor"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}}, "rope_parameters"),
    ({"model_type": "llama"}, "model_type"),
    ({"vocab_size": 0}, "vocab_size"),
])
def test_bad_fields_name_themselves(change, field):
    d = {**ModelConfig.preset("tiny").to_hf(), **change}
    with pytest.raises(ConfigError, match=field):
        ModelConfig.from_hf(d)


def test_unknown_preset():
    with pytest.raises(ConfigError, match="presets"):
        ModelConfig.preset("glm-9")
