"""The Muon block rule (docs/training.md, Muon blocks): Newton–Schulz sees one block per matrix the papers name.
Fused parameters are cut back into their parts, the same way everywhere: routed experts' [W_gate; W_up] like the
dense MLP's separate gate_proj / up_proj, MLA's [W^DKV; W^KR], and per head GLM-5's Muon Split of the MLA
up-projections, [W^UQ; W^QR] and [W^UK; W^UV], each block with its own RMS-matching lr scale.
OptimConfig.muon_split can turn a split off (0 = whole matrix)."""

import torch

from glmstack.model import GLM, ModelConfig
from glmstack.optim.groups import build_optimizer
from glmstack.optim.muon import lr_scale, zeropower_via_newtonschulz
from glmstack.train.config import OptimConfig


def tiny_glm5():
    return GLM(ModelConfig.preset("tiny-glm5", num_hidden_layers=2)).init_weights(seed=0)


def blocks_of(opt, p):
    return next(g["blocks"] for g in opt.optimizers["muon"].param_groups if any(q is p for q in g["params"]))


def test_one_block_rule_everywhere():
    model = tiny_glm5()
    opt, _ = build_optimizer(model, OptimConfig())
    attn, H = model.layers[0].self_attn, model.cfg.num_attention_heads
    nope, rope, v = attn.nope_dim, attn.rope_dim, attn.v_dim
    assert blocks_of(opt, attn.q_b_proj.weight) == (H, (nope, rope))  # W^UQ, W^QR per head
    assert blocks_of(opt, attn.kv_b_proj.weight) == (H, (nope, v))  # W^UK, W^UV per head (GLM-5 names both)
    assert blocks_of(opt, attn.kv_a_proj_with_mqa.weight) == (1, (attn.kv_lora_rank, rope))  # W^DKV, W^KR
    assert blocks_of(opt, attn.q_a_proj.weight) is None and blocks_of(opt, attn.o_proj.weight) is None
    moe = next(layer.mlp for layer in model.layers if hasattr(layer.mlp, "experts"))
    F_ = model.cfg.moe_intermediate_size
    assert blocks_of(opt, moe.experts.gate_up_proj) == (1, (F_, F_))  # W_gate, W_up of each expert apart
    shared = moe.shared_experts  # the dense MLP and the shared expert hold gate and up as separate matrices
    assert blocks_of(opt, shared.gate_proj.weight) is None and blocks_of(opt, shared.up_proj.weight) is None
    opt_off, _ = build_optimizer(model, OptimConfig(muon_split={"q_b_proj.weight": 0, "kv_b_proj.weight": 0}))
    assert blocks_of(opt_off, attn.q_b_proj.weight) is None


def _first_step_by_hand(g_NAB, cfg):
    """Muon's first step on N stacked matrices: momentum (1-μ)·g, Nesterov g.lerp(buf, μ), NS, scaled update."""
    m = torch.zeros_like(g_NAB).lerp_(g_NAB, 1 - cfg.momentum)
    ns = zeropower_via_newtonschulz(g_NAB.lerp(m, cfg.momentum), cfg.ns_steps, dtype=torch.float32)
    return -cfg.lr * lr_scale(tuple(ns.shape[-2:]), cfg.adjust_lr) * ns


def test_blocks_are_orthogonalised_apart_with_their_own_scale():
    model = tiny_glm5()
    attn = model.layers[0].self_attn
    moe = next(layer.mlp for layer in model.layers if hasattr(layer.mlp, "experts"))
    w, bank = attn.kv_b_proj.weight, moe.experts.gate_up_proj
    H, nope, v, F_ = model.cfg.num_attention_heads, attn.nope_dim, attn.v_dim, model.cfg.moe_intermediate_size
    for p in model.parameters():
        p.grad = None
    w.grad, bank.grad = torch.randn_like(w), torch.randn_like(bank)
    cfg = OptimConfig(lr=0.01, weight_decay=0.0, ns_dtype="float32")
    opt, _ = build_optimizer(model, cfg)
    w0, bank0 = w.detach().clone(), bank.detach().clone()
    opt.step()
    g_H = w.grad.view(H, nope + v, -1)
    want = torch.cat([_first_step_by_hand(g_H[:, :nope], cfg), _first_step_by_hand(g_H[:, nope:], cfg)], 1)
    torch.testing.assert_close(w.detach() - w0, want.reshape(w.shape), atol=1e-6, rtol=1e-5)
    g_E = bank.grad  # (E, 2F, D): gate rows, then up rows, of every expert
    want = torch.cat([_first_step_by_hand(g_E[:, :F_], cfg), _first_step_by_hand(g_E[:, F_:], cfg)], 1)
    torch.testing.assert_close(bank.detach() - bank0, want, atol=1e-6, rtol=1e-5)
