"""glmstack GLM (model_type glm4_moe_lite) == transformers Glm4MoeLiteForCausalLM (GLM-4.7-Flash), both directions.

GLM-4.7-Flash is GLM-4.5's MoE with MLA attention and no DSA indexer. Random tiny configs, every tensor randomised
(norms, biases and the balancing bias included): the query latent on and off (`q_lora_rank` None -> one `q_proj`),
first_k_dense_replace 0/1/2, norm_topk_prob on/off, interleaved and half-split RoPE, attention bias, tied embeddings.
"""

import pytest
import torch
from hf_helpers import assert_lm_grads_match, hf_model, random_ids, randomise_, shifted_labels
from safetensors import safe_open

from glmstack.model import GLM, ModelConfig, load_hf, save_hf
from glmstack.model.hf import hf_entries

transformers = pytest.importorskip("transformers")

CASES = {
    "base": {},  # q_lora_rank 32, first layer dense, norm_topk_prob, interleaved RoPE (the release's shape)
    "no_q_lora_dense0": {"q_lora_rank": None, "first_k_dense_replace": 0, "norm_topk_prob": False},
    "dense2_bias_halfsplit_tied": {"first_k_dense_replace": 2, "attention_bias": True, "rope_interleave": False,
                                   "tie_word_embeddings": True, "n_shared_experts": 2, "routed_scaling_factor": 1.0},
}


def tiny(case, **extra):
    """transformers' main model has no MTP layer: compare without one (MTP round trip: test_mtp_layer_round_trip)."""
    return ModelConfig.preset("tiny-glm47-flash", **{**CASES[case], "num_nextn_predict_layers": 0, **extra})


def file_keys(folder):
    keys = set()
    for path in folder.glob("*.safetensors"):
        with safe_open(str(path), framework="pt") as f:
            keys |= set(f.keys())
    return keys


@pytest.mark.parametrize("case", list(CASES))
def test_hf_to_glmstack_logits(case, tmp_path):
    cfg = tiny(case)
    hf = hf_model(cfg)
    hf.save_pretrained(tmp_path)
    ours = load_hf(tmp_path, dtype=torch.float32)
    assert ours.cfg.model_type == "glm4_moe_lite" and ours.cfg.first_k_dense_replace == cfg.first_k_dense_replace
    ids = random_ids(cfg)
    with torch.no_grad():
        ref = hf(ids, labels=ids)
        out = ours(ids, labels=shifted_labels(ids))
    torch.testing.assert_close(out.logits, ref.logits, atol=1e-4, rtol=0)
    assert torch.equal(out.logits.argmax(-1), ref.logits.argmax(-1))
    torch.testing.assert_close(out.lm_loss, ref.loss, atol=1e-5, rtol=0)


@pytest.mark.parametrize("case", list(CASES))
def test_tensor_names_are_transformers(case, tmp_path):
    """What transformers writes is exactly what save_hf writes (per-expert names, q_proj without a latent)."""
    cfg = tiny(case)
    hf_model(cfg).save_pretrained(tmp_path / "hf")
    ours = GLM(cfg).init_weights(seed=0)
    save_hf(ours, tmp_path / "ours")
    names = file_keys(tmp_path / "hf")
    assert names == set(hf_entries(ours)) == file_keys(tmp_path / "ours")
    q = "model.layers.0.self_attn.q_proj.weight"
    assert (q in names) == (cfg.q_lora_rank is None)
    assert not any(".indexer." in k for k in names)


@pytest.mark.parametrize("case", ["base", "no_q_lora_dense0"])
def test_lm_loss_gradients_match_hf(case, tmp_path):
    cfg = tiny(case)
    hf = hf_model(cfg)
    hf.save_pretrained(tmp_path)
    ours = load_hf(tmp_path, dtype=torch.float32)
    assert_lm_grads_match(ours, hf, random_ids(cfg, seed=2))


@pytest.mark.parametrize("case", list(CASES))
def test_glmstack_to_hf_logits(case, tmp_path):
    """save_hf writes the MTP layer as the release does (model.layers.{n}); transformers skips it on load."""
    cfg = tiny(case, num_nextn_predict_layers=1)
    ours = GLM(cfg).init_weights(seed=3)
    randomise_(ours, seed=4)
    save_hf(ours, tmp_path)
    hf = transformers.Glm4MoeLiteForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    ids = random_ids(cfg, seed=1)
    with torch.no_grad():
        a, b = ours(ids).logits, hf(ids).logits
    torch.testing.assert_close(a, b, atol=1e-4, rtol=0)
    assert torch.equal(a.argmax(-1), b.argmax(-1))


def test_mtp_layer_round_trip(tmp_path):
    """The MTP layer is decoder layer num_hidden_layers in the file (an MLA + MoE block + enorm/hnorm/eh_proj)."""
    cfg = ModelConfig.preset("tiny-glm47-flash")
    ours = GLM(cfg).init_weights(seed=0)
    randomise_(ours, seed=5)
    save_hf(ours, tmp_path)
    n = cfg.num_hidden_layers
    names = file_keys(tmp_path)
    for suffix in ("enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight",
                   "self_attn.kv_b_proj.weight", "mlp.gate.e_score_correction_bias", "mlp.experts.7.down_proj.weight"):
        assert f"model.layers.{n}.{suffix}" in names, suffix
    back = load_hf(tmp_path, dtype=torch.float32)
    ids = random_ids(cfg)
    out_a, out_b = ours(ids, labels=shifted_labels(ids)), back(ids, labels=shifted_labels(ids))
    assert len(out_a.mtp_loss) == 1
    torch.testing.assert_close(out_a.loss, out_b.loss, atol=0, rtol=0)


def test_transformers_config_round_trip():
    """Glm4MoeLiteConfig(**to_hf()).to_dict() (what save_pretrained writes) reads back to the same config; the dense
    prefix reaches transformers through mlp_layer_types, which it reads instead of first_k_dense_replace."""
    for case in CASES:
        cfg = tiny(case)
        hf = transformers.Glm4MoeLiteConfig(**cfg.to_hf())
        assert hf.mlp_layer_types.count("dense") == cfg.first_k_dense_replace
        assert hf.head_dim == hf.qk_rope_head_dim == cfg.qk_rope_head_dim and hf.q_lora_rank == cfg.q_lora_rank
        back = ModelConfig.from_hf(hf.to_dict())
        assert {**vars(back), "hf_metadata": {}} == {**vars(cfg), "hf_metadata": {}}
