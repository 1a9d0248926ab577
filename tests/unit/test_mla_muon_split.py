"""Muon Split (GLM-5 §2.1) is on by default for MLA: each head's rows of q_b_proj / kv_b_proj are orthogonalised
as their own matrix, with their own RMS-matching lr scale; OptimConfig.muon_split can turn it off."""

import torch

from glmstack.model import GLM, ModelConfig
from glmstack.optim.groups import build_optimizer
from glmstack.optim.muon import lr_scale, zeropower_via_newtonschulz
from glmstack.train.config import OptimConfig


def tiny_glm5():
    return GLM(ModelConfig.preset("tiny-glm5", num_hidden_layers=2)).init_weights(seed=0)


def split_of(opt, p):
    return next(g["split"] for g in opt.optimizers["muon"].param_groups if any(q is p for q in g["params"]))


def test_mla_up_projections_split_per_head_by_default():
    model = tiny_glm5()
    opt, _ = build_optimizer(model, OptimConfig())
    attn = model.layers[0].self_attn
    assert split_of(opt, attn.q_b_proj.weight) == attn.n_heads
    assert split_of(opt, attn.kv_b_proj.weight) == attn.n_heads
    assert not split_of(opt, attn.q_a_proj.weight) and not split_of(opt, attn.o_proj.weight)
    opt_off, _ = build_optimizer(model, OptimConfig(muon_split={"q_b_proj.weight": 0, "kv_b_proj.weight": 0}))
    assert not split_of(opt_off, attn.q_b_proj.weight)


def test_split_step_orthogonalises_each_head_separately():
    model = tiny_glm5()
    w = model.layers[0].self_attn.kv_b_proj.weight
    H = model.cfg.num_attention_heads
    for p in model.parameters():
        p.grad = None
    w.grad = torch.randn_like(w)
    cfg = OptimConfig(lr=0.01, weight_decay=0.0, ns_dtype="float32")
    opt, _ = build_optimizer(model, cfg)
    before = w.detach().clone()
    opt.step()
    # first step: momentum buf = (1-μ)·g, Nesterov direction = g.lerp(buf, μ), then NS per head slice
    g_HAB = w.grad.view(H, -1, w.shape[1])
    m = torch.zeros_like(g_HAB).lerp_(g_HAB, 1 - cfg.momentum)
    nesterov = g_HAB.lerp(m, cfg.momentum)
    ns = zeropower_via_newtonschulz(nesterov, cfg.ns_steps, dtype=torch.float32)
    want = before - cfg.lr * lr_scale(tuple(ns.shape[-2:]), cfg.adjust_lr) * ns.reshape(w.shape)
    torch.testing.assert_close(w.detach(), want, atol=1e-6, rtol=1e-5)
