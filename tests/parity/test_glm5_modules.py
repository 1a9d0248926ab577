"""Module-level parity of glmstack's MLA + DSA attention with transformers' `GlmMoeDsaAttention` (GLM-5).

Weights are copied by name (the HF names are ours), the same input and RoPE go through both, and the outputs must
agree to 1e-5 with index_topk below the sequence length (real sparsity) and above it (DSA == dense MLA), and for an
IndexShare "shared" layer fed the previous layer's top-k.
"""

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers.models.glm_moe_dsa import modeling_glm_moe_dsa as hf

from glmstack.model.mla import MLAttention
from glmstack.model.rope import rope_cos_sin


def hf_config(index_topk=5, **kw):
    cfg = transformers.GlmMoeDsaConfig(
        vocab_size=97, hidden_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
        q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=12, qk_rope_head_dim=8, v_head_dim=10,
        index_n_heads=4, index_head_dim=16, index_topk=index_topk, n_routed_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=16, intermediate_size=32, first_k_dense_replace=1,
        rope_parameters={"rope_theta": 10000.0, "rope_type": "default"}, **kw,
    )
    cfg._attn_implementation = "eager"
    return cfg


def pair(cfg, layer_idx=0, seed=0):
    torch.manual_seed(seed)
    ref = hf.GlmMoeDsaAttention(cfg, layer_idx).eval()
    for p in ref.parameters():
        p.data.normal_(0, 0.2)
    ours = MLAttention(cfg, layer_idx).eval()
    missing, unexpected = ours.load_state_dict(ref.state_dict(), strict=True)
    assert not missing and not unexpected
    return ref, ours


def run_hf(ref, cfg, x, prev_topk=None):
    B, T, _ = x.shape
    pos = torch.arange(T)[None].expand(B, T)
    cos, sin = hf.GlmMoeDsaRotaryEmbedding(cfg)(x, pos)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    mask = torch.zeros(B, 1, T, T).masked_fill(~causal, torch.finfo(torch.float32).min)
    out, _, topk = ref(x, (cos, sin), mask, position_ids=pos, prev_topk_indices=prev_topk)
    return out, topk


def run_ours(ours, cfg, x):
    B, T, _ = x.shape
    pos = torch.arange(T)[None].expand(B, T)
    cos, sin = rope_cos_sin(pos, cfg.qk_rope_head_dim, 10000.0, x.dtype)
    return ours(x, cos, sin)


@pytest.mark.parametrize("topk,T", [(5, 11), (16, 11), (3, 9)])
def test_mla_dsa_matches_hf(topk, T):
    cfg = hf_config(index_topk=topk)
    ref, ours = pair(cfg)
    x = torch.randn(2, T, cfg.hidden_size)
    with torch.no_grad():
        want, _ = run_hf(ref, cfg, x)
        got = run_ours(ours, cfg, x)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_sparse_differs_from_dense_when_topk_below_length():
    """Guards the test above: with k < T the selection must actually change the output."""
    cfg = hf_config(index_topk=3)
    _, ours = pair(cfg)
    x = torch.randn(1, 10, cfg.hidden_size)
    with torch.no_grad():
        sparse = run_ours(ours, cfg, x)
        ours.indexer.topk = 10
        dense = run_ours(ours, cfg, x)
    assert (sparse - dense).abs().max() > 1e-3


def test_index_share_layer_matches_hf():
    """A "shared" layer has no indexer and reuses the top-k published by the last full layer."""
    cfg = hf_config(index_topk=4, index_topk_pattern="FS")
    assert cfg.indexer_types == ["full", "shared"]
    ref0, ours0 = pair(cfg, 0, seed=0)
    ref1, ours1 = pair(cfg, 1, seed=1)
    assert ours1.indexer is None
    share = {}
    ours0.topk_share = ours1.topk_share = share
    x = torch.randn(2, 9, cfg.hidden_size)
    with torch.no_grad():
        want0, topk = run_hf(ref0, cfg, x)
        want1, _ = run_hf(ref1, cfg, x, prev_topk=topk)
        got0, got1 = run_ours(ours0, cfg, x), run_ours(ours1, cfg, x)
    torch.testing.assert_close(got0, want0, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got1, want1, atol=1e-5, rtol=1e-5)
