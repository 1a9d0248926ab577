"""glmstack GLM (model_type glm_moe_dsa) == transformers GlmMoeDsaForCausalLM (GLM-5): logits both load directions.

Random tiny configs (every tensor randomised, norms and the balancing bias included) with index_topk below the
sequence length (real DSA sparsity), above it (DSA == dense MLA), IndexShare ("shared" layers) and tied embeddings.
Our indexers break exact top-k ties by key order by default (dsa.select_topk; random tiny indexers tie often);
these tests switch them to torch.topk's order, transformers' (`hf_tie_order`).
"""

import pytest
import torch
from hf_helpers import assert_lm_grads_match, hf_model, random_ids, randomise_, shifted_labels
from reference import reference_file

from glmstack.model import GLM, ModelConfig, load_hf, save_hf

transformers = pytest.importorskip("transformers")

CASES = {
    "topk_below_T": {"index_topk": 5},
    "topk_above_T": {"index_topk": 64},
    "index_share": {"index_topk": 6, "num_hidden_layers": 4, "indexer_types": ["full", "shared", "full", "shared"]},
    "dense2_tied": {"index_topk": 7, "first_k_dense_replace": 2, "tie_word_embeddings": True,
                    "n_routed_experts": 4, "num_experts_per_tok": 3},
}


def hf_tie_order(model):
    """Top-k ties in torch.topk's order, as transformers' GlmMoeDsaIndexer (ours: earliest key, shape-independent)."""
    for attn in model.attentions():
        if attn.indexer is not None:
            attn.indexer.stable_ties = False
    return model


def tiny(case, **extra):
    return ModelConfig.preset("tiny-glm5", **{**CASES[case], "num_nextn_predict_layers": 0, "num_mtp_depths": 0,
                                              **extra})


@pytest.mark.parametrize("case", list(CASES))
def test_hf_to_glmstack_logits(case, tmp_path):
    cfg = tiny(case)
    hf = hf_model(cfg)
    hf.save_pretrained(tmp_path)
    ours = hf_tie_order(load_hf(tmp_path, dtype=torch.float32))
    assert ours.cfg.indexer_types == hf.config.indexer_types
    ids = random_ids(cfg)
    with torch.no_grad():
        ref = hf(ids, labels=ids)
        out = ours(ids, labels=shifted_labels(ids))
    torch.testing.assert_close(out.logits, ref.logits, atol=1e-4, rtol=0)
    torch.testing.assert_close(out.lm_loss, ref.loss, atol=1e-5, rtol=0)


@pytest.mark.parametrize("case", ["topk_below_T", "index_share"])
def test_lm_loss_gradients_match_hf(case, tmp_path):
    """Every non-indexer gradient matches; the indexer gets none from the LM loss (HF's is @torch.no_grad)."""
    cfg = tiny(case)
    hf = hf_model(cfg)
    hf.save_pretrained(tmp_path)
    ours = hf_tie_order(load_hf(tmp_path, dtype=torch.float32))
    assert_lm_grads_match(ours, hf, random_ids(cfg, seed=2), no_grad=lambda name: ".indexer." in name)


@pytest.mark.parametrize("case", ["topk_below_T", "index_share"])
def test_glmstack_to_hf_logits(case, tmp_path):
    cfg = tiny(case)
    ours = GLM(cfg).init_weights(seed=3)
    randomise_(ours, seed=4)
    hf_tie_order(ours)
    save_hf(ours, tmp_path)
    hf = transformers.GlmMoeDsaForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    ids = random_ids(cfg, seed=1)
    with torch.no_grad():
        a, b = ours(ids).logits, hf(ids).logits
    torch.testing.assert_close(a, b, atol=1e-4, rtol=0)


def test_round_trip_with_shared_mtp(tmp_path):
    """GLM-5 keeps one MTP layer (HF layer index num_hidden_layers, with its own indexer) used for 3 depths."""
    cfg = ModelConfig.preset("tiny-glm5")
    assert cfg.num_nextn_predict_layers == 1 and cfg.mtp_depths == 3
    ours = GLM(cfg).init_weights(seed=0)
    save_hf(ours, tmp_path)
    back = load_hf(tmp_path, dtype=torch.float32, num_mtp_depths=3)
    ids = random_ids(cfg)
    out_a, out_b = ours(ids, labels=shifted_labels(ids)), back(ids, labels=shifted_labels(ids))
    assert len(out_a.mtp_loss) == 3
    torch.testing.assert_close(out_a.loss, out_b.loss, atol=0, rtol=0)


def test_bf16_keeps_indexer_head_weights_fp32(tmp_path):
    cfg = tiny("topk_below_T")
    ours = GLM(cfg, dtype=torch.bfloat16).init_weights(seed=0)
    ix = ours.layers[0].self_attn.indexer
    assert ix.weights_proj.weight.dtype == torch.float32 and ix.wq_b.weight.dtype == torch.bfloat16
    save_hf(ours, tmp_path)
    from safetensors import safe_open

    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as f:
        w = f.get_tensor("model.layers.0.self_attn.indexer.weights_proj.weight")
    assert w.dtype == torch.float32 and torch.equal(w, ix.weights_proj.weight)
    back = load_hf(tmp_path)
    assert back.layers[0].self_attn.indexer.weights_proj.weight.dtype == torch.float32


def test_glm5_preset_is_the_released_config():
    import dataclasses

    ref = ModelConfig.from_hf(reference_file("configs", "glm-5.json"), num_mtp_depths=3)
    preset = ModelConfig.preset("glm-5")
    assert dataclasses.replace(ref, hf_metadata={}) == dataclasses.replace(preset, hf_metadata={})
    hf = transformers.GlmMoeDsaConfig(**ModelConfig.preset("glm-5").to_hf())
    assert (hf.qk_head_dim, hf.head_dim, hf.indexer_types.count("full")) == (256, 64, 78)


def test_index_share_schedule_from_hf_keys():
    """GLM-5.2 style freq/offset keys become indexer_types (21 full of 78 layers) and are written back as a list."""
    d = {**ModelConfig.preset("glm-5").to_hf(), "index_topk_freq": 4, "index_skip_topk_offset": 3}
    del d["indexer_types"]
    cfg = ModelConfig.from_hf(d)
    assert cfg.indexer_types.count("full") == 21 and cfg.indexer_types[:4] == ["full"] * 3 + ["shared"]
    assert transformers.GlmMoeDsaConfig(**cfg.to_hf()).indexer_types == cfg.indexer_types
