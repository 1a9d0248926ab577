"""The decode fast path (inference/fast.py) == the model's own forward: logits, hidden, MTP step, tokens."""

import pytest
import torch
import torch.nn.functional as F

import glmstack.inference.fast as fastpath
from glmstack.inference import Engine, KVCache
from glmstack.inference.fast import (
    FastForward,
    ReferenceForward,
    experts_dense,
    experts_packed,
)
from glmstack.model import GLM, ModelConfig
from glmstack.model.moe import experts_loop


@pytest.fixture(scope="module")
def model():
    return GLM(ModelConfig.preset("tiny", num_nextn_predict_layers=2)).init_weights(seed=0).eval()


def test_fast_expert_kernels_equal_loop_reference():
    g = torch.Generator().manual_seed(0)
    x, w1, w2 = torch.randn(5, 16, generator=g), torch.randn(8, 16, 16, generator=g), torch.randn(8, 16, 8, generator=g)
    idx = torch.rand(5, 8, generator=g).topk(3).indices
    w = torch.rand(5, 3, generator=g)
    ref = experts_loop(x, idx, w, w1, w2)
    w1_dense, w2_dense = w1.reshape(-1, 16), w2.permute(1, 0, 2).reshape(16, 8 * 8)  # experts_dense's layouts
    torch.testing.assert_close(experts_dense(x, idx, w, w1_dense, w2_dense, n_experts=8), ref)
    if torch.backends.mkldnn.is_available():  # the same banks prepacked for oneDNN
        pack = torch.ops.mkldnn._reorder_linear_weight
        packed = pack(w1_dense, 8), pack(w2_dense.contiguous(), 8)
        torch.testing.assert_close(experts_dense(x, idx, w, *packed, n_experts=8), ref)
    if torch.backends.mkldnn.is_available():  # per-expert prepacked weights (experts_packed)
        w1_E, w2_E = [pack(w_e, 8) for w_e in w1.unbind()], [pack(w_e, 8) for w_e in w2.unbind()]
        torch.testing.assert_close(experts_packed(x, idx, w, w1_E, w2_E), ref)
    # a shared expert (width 12) appended to both banks rides in the same GEMMs with weight 1
    sg, su, sd = torch.randn(12, 16, generator=g), torch.randn(12, 16, generator=g), torch.randn(16, 12, generator=g)
    shared = F.linear(F.silu(F.linear(x, sg)) * F.linear(x, su), sd)
    w1_s, w2_s = torch.cat([w1_dense, sg, su]), torch.cat([w2_dense, sd], dim=1)
    torch.testing.assert_close(experts_dense(x, idx, w, w1_s, w2_s, n_experts=8, shared_F=12), ref + shared)


@torch.inference_mode()
# sorted experts; all experts dense (experts_dense); every projection through oneDNN at 2+ rows
@pytest.mark.parametrize("dense_max_tokens, onednn_min_n", [(0, None), (64, None), (0, 0)])
def test_forward_and_mtp_step_match_reference(model, dense_max_tokens, onednn_min_n, monkeypatch):
    if onednn_min_n is not None:
        monkeypatch.setattr(fastpath, "ONEDNN_MIN_N", onednn_min_n)
        monkeypatch.setattr(fastpath, "ONEDNN_MIN_ROWS", 2)  # and experts_packed when not dense
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 500, (2, 9), generator=g)
    start = torch.tensor([0, 3])  # row 1 left-padded
    pos = (torch.arange(9) - start[:, None]).clamp_min(0)
    outs = []
    for run in (ReferenceForward(model), FastForward(model, 32, dense_max_tokens=dense_max_tokens)):
        cache = KVCache(2, 32, start=start)
        prefill = run.forward(ids[:, :6], pos[:, :6], cache)
        block = run.forward(ids[:, 6:], pos[:, 6:], cache)  # 3 tokens after 6: offset causal mask
        cache.rewind(torch.tensor([1, 2]))  # rows now at different lengths
        step = run.forward(ids[:, 6:7], pos[:, 7:8], cache)
        mtp = run.mtp_step(1, ids[:, 1:7], prefill[1], pos[:, :6], cache)
        cache.rewind(6, layers=[model.cfg.num_hidden_layers + 1])
        last = run.mtp_step(1, ids[:, 1:7], prefill[1], pos[:, :6], cache, last_B=torch.tensor([5, 2]))
        torch.testing.assert_close(last[1], mtp[1][[0, 1], [5, 2]], atol=1e-5, rtol=0)  # the head at one position
        outs.append([*prefill, *block, *step, *mtp, *last])
    for ref, fast in zip(*outs):
        torch.testing.assert_close(fast, ref, atol=2e-5, rtol=1e-4)


def test_engine_tokens_equal_with_fast_on_and_off(model):
    prompts = [[5, 17, 300, 2, 9, 41, 7], [11], [400, 3, 3, 8]]
    on = Engine(model, fast=True).generate(prompts, 16, stop_ids=[]).tokens
    off = Engine(model, fast=False).generate(prompts, 16, stop_ids=[]).tokens
    assert on == off
    dense = Engine(model, fast=True)
    dense.dense_max_tokens = 64  # every decode step and verify block through experts_dense
    assert dense.generate(prompts, 16, stop_ids=[]).tokens == off
    assert dense.generate(prompts, 16, stop_ids=[], speculative="mtp", draft_k=3).tokens == off


def test_engine_tokens_equal_with_onednn_projections(model, monkeypatch):
    prompts = [[5, 17, 300, 2, 9, 41, 7], [11], [400, 3, 3, 8]]
    off = Engine(model, fast=False).generate(prompts, 16, stop_ids=[]).tokens
    monkeypatch.setattr(fastpath, "ONEDNN_MIN_N", 0)  # every projection (and the head) through oneDNN at 2+ rows
    monkeypatch.setattr(fastpath, "ONEDNN_MIN_ROWS", 2)  # and the routed experts above 2 tokens (experts_packed)
    engine = Engine(model, fast=True)
    assert engine.generate(prompts, 16, stop_ids=[]).tokens == off
    assert engine.generate(prompts, 16, stop_ids=[], speculative="mtp", draft_k=3).tokens == off


def test_router_and_one_token_experts_match_reference(model):
    from glmstack.inference.fast import experts_one_token, route

    moe = model.layers[1].mlp
    x = torch.randn(3, model.cfg.hidden_size)
    _, idx_ref, w_ref = moe.gate(x)
    idx, w = route(moe.gate, x)
    assert torch.equal(idx.sort(-1).values, idx_ref.sort(-1).values)
    torch.testing.assert_close(w.gather(1, idx.argsort(-1)), w_ref.gather(1, idx_ref.argsort(-1)))
    w1, w2 = moe.experts.gate_up_proj, moe.experts.down_proj
    torch.testing.assert_close(
        experts_one_token(x[:1], idx[:1], w[:1], w1.transpose(1, 2), w2.transpose(1, 2)),
        experts_loop(x[:1], idx[:1], w[:1], w1, w2),
    )


def test_engine_sees_in_place_weight_updates():
    """RL updates the policy in place between rollouts: the fast path's expert copies must follow."""
    model = GLM(ModelConfig.preset("tiny")).init_weights(seed=2).eval()
    engine, prompt = Engine(model), [[3, 9, 27, 81]]
    engine.generate(prompt, 4, stop_ids=[])
    with torch.no_grad():
        for moe in model.moe_layers():
            moe.experts.gate_up_proj.mul_(-3.0)
            moe.experts.down_proj.add_(0.05)
    assert (
        engine.generate(prompt, 8, stop_ids=[]).tokens
        == Engine(model, fast=False).generate(prompt, 8, stop_ids=[]).tokens
    )
    engine.dense_max_tokens = 64  # experts_dense's down-bank copy must follow too
    engine.generate([prompt[0], prompt[0][:2]], 4, stop_ids=[])
    with torch.no_grad():
        for moe in model.moe_layers():
            moe.experts.down_proj.mul_(2.0)
    two = [prompt[0], prompt[0][:2]]
    assert engine.generate(two, 8, stop_ids=[]).tokens == Engine(model, fast=False).generate(two, 8, stop_ids=[]).tokens


@pytest.mark.parametrize("onednn_min_n", [None, 0])  # (D, N) copies; also oneDNN-packed copies of every projection
def test_engine_sees_in_place_updates_of_fused_projections(onednn_min_n, monkeypatch):
    """The fast path's (D, N) copies of q/k/v, o, the dense and shared-expert gate/up/down and the LM head (and the
    stacked q/k-norm weights) must follow in-place updates and replaced weights too."""
    if onednn_min_n is not None:
        monkeypatch.setattr(fastpath, "ONEDNN_MIN_N", onednn_min_n)
        monkeypatch.setattr(fastpath, "ONEDNN_MIN_ROWS", 2)  # and the routed experts (experts_packed)
        monkeypatch.setattr(fastpath, "DENSE_MAX_TOKENS", 0)
    model = GLM(ModelConfig.preset("tiny")).init_weights(seed=3).eval()
    engine, prompts = Engine(model), [[3, 9, 27, 81], [5, 6]]
    before = engine.generate(prompts, 6, stop_ids=[]).tokens
    with torch.no_grad():
        for block in model.layers:
            a = block.self_attn
            for lin in (a.q_proj, a.k_proj, a.v_proj, a.o_proj):
                lin.weight.mul_(1.5)
            a.q_proj.bias.add_(0.1)
            a.q_norm.weight.mul_(-1.0)
            a.k_norm.weight.add_(0.5)
            mlp = block.mlp.shared_experts if hasattr(block.mlp, "shared_experts") else block.mlp
            mlp.gate_proj.weight.mul_(-2.0)
            mlp.down_proj.weight.add_(0.01)
            if hasattr(block.mlp, "experts"):
                block.mlp.experts.gate_up_proj.mul_(-3.0)
        model.lm_head.weight.copy_(torch.randn_like(model.lm_head.weight) * 0.05)
    after = engine.generate(prompts, 6, stop_ids=[]).tokens
    assert after == Engine(model, fast=False).generate(prompts, 6, stop_ids=[]).tokens
    assert after != before  # the updates did change the output
    model.lm_head.weight = torch.nn.Parameter(torch.randn_like(model.lm_head.weight) * 0.05)  # replaced
    assert (
        engine.generate(prompts, 6, stop_ids=[]).tokens
        == Engine(model, fast=False).generate(prompts, 6, stop_ids=[]).tokens
    )


def test_model_built_under_inference_mode_decodes():
    """A model created (or loaded) inside torch.inference_mode has inference tensors, which have no version
    counter: the fast path's weight-copy cache must still work, and give the reference's tokens."""
    plain = GLM(ModelConfig.preset("tiny")).init_weights(seed=0).eval()
    with torch.inference_mode():
        model = GLM(ModelConfig.preset("tiny")).init_weights(seed=0).eval()
        out = Engine(model).generate([[1, 2, 3], [4, 5]], 6, stop_ids=[]).tokens
    assert out == Engine(plain, fast=False).generate([[1, 2, 3], [4, 5]], 6, stop_ids=[]).tokens
