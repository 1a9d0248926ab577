"""LoRA (model/lora.py): the adapted model starts equal to its base, only adapters train, the batched per-expert
adapters equal a per-expert reference on every expert path, merging equals the unmerged model, bad targets fail."""

import pytest
import torch

from glmstack.errors import ConfigError
from glmstack.model import GLM, ModelConfig
from glmstack.model.lora import LoraConfig, apply_lora, lora_names, merged_state_dict
from glmstack.model.moe import experts_loop
from glmstack.optim import build_optimizer
from glmstack.train.config import OptimConfig

PRESETS = {"glm4_moe": "tiny", "glm4_moe_lite": "tiny-glm47-flash", "glm_moe_dsa": "tiny-glm5"}
ALL = ["attention", "mlp", "experts", "indexer", "mtp"]


def tiny(kind="glm4_moe", **extra):
    return GLM(ModelConfig.preset(PRESETS[kind], **extra)).init_weights(seed=0)


def ids(B=2, T=12, seed=0):
    return torch.randint(0, 200, (B, T), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def perturb_adapters(model, seed=1):
    """Non-zero B (an adapter that has trained), so every delta shows in the output."""
    g = torch.Generator().manual_seed(seed)
    for name in lora_names(model):
        p = model.get_parameter(name)
        p.copy_(torch.randn(p.shape, generator=g) * 0.05)


@pytest.mark.parametrize("kind", list(PRESETS))
def test_fresh_adapters_leave_the_model_unchanged_and_only_they_train(kind):
    model = tiny(kind)
    x = ids()
    with torch.no_grad():
        before = model(x).logits
    names = apply_lora(model, LoraConfig(r=4, targets=ALL), seed=0)
    with torch.no_grad():
        torch.testing.assert_close(model(x).logits, before, atol=0, rtol=0)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable == names and names
    assert any(".experts.lora_A.gate_up_proj" in n for n in names)
    assert any(".self_attn." in n for n in names) and any(n.startswith("mtp.") for n in names)
    if kind == "glm_moe_dsa":
        assert any(".indexer.wq_b.lora_A" in n for n in names)
    opt, _ = build_optimizer(model, OptimConfig(muon=False))
    in_opt = {id(p) for g in opt.param_groups for p in g["params"]}
    assert in_opt == {id(model.get_parameter(n)) for n in names}


@pytest.mark.parametrize("kind", list(PRESETS))
def test_merged_state_equals_unmerged_model(kind):
    model = tiny(kind)
    apply_lora(model, LoraConfig(r=4, alpha=8, use_rslora=True, targets=ALL))
    perturb_adapters(model)
    merged = GLM(model.cfg)
    merged.load_state_dict(merged_state_dict(model), assign=True)
    merged.eval(), model.eval()
    x = ids(seed=2)
    with torch.no_grad():
        a, b = model(x).logits, merged(x).logits
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_batched_expert_adapters_equal_a_per_expert_reference():
    """One bmm for all experts == each expert's B_e A_e applied by hand, through the sorted (fast) and loop paths,
    forward and the adapters' gradients."""
    cfg = ModelConfig.preset("tiny")
    results = []
    for grouped in (True, False):
        model = GLM(ModelConfig.preset("tiny", use_grouped_mm=grouped)).init_weights(seed=0)
        apply_lora(model, LoraConfig(r=3, targets=["experts"]))
        perturb_adapters(model)
        out = model(ids(), labels=ids(seed=3))
        out.loss.backward()
        results.append((out.logits.detach(), {n: model.get_parameter(n).grad.clone() for n in lora_names(model)}))
    torch.testing.assert_close(results[0][0], results[1][0], atol=1e-5, rtol=0)
    for n, g in results[0][1].items():
        torch.testing.assert_close(g, results[1][1][n], atol=1e-5, rtol=1e-4, msg=n)
    # by hand: expert e's weights + s * B_e @ A_e, through the plain per-expert reference
    experts = model.layers[1].mlp.experts
    torch.manual_seed(0)
    T, K, E = 10, 2, experts.n_experts
    x = torch.randn(T, cfg.hidden_size)
    idx, w = torch.rand(T, E).topk(K, dim=-1).indices, torch.rand(T, K)
    s = experts.lora_scaling["gate_up_proj"]
    gu = torch.stack(
        [
            experts.gate_up_proj[e] + s * experts.lora_B["gate_up_proj"][e] @ experts.lora_A["gate_up_proj"][e]
            for e in range(E)
        ]
    )
    dn = torch.stack(
        [experts.down_proj[e] + s * experts.lora_B["down_proj"][e] @ experts.lora_A["down_proj"][e] for e in range(E)]
    )
    with torch.no_grad():
        torch.testing.assert_close(experts(x, idx, w), experts_loop(x, idx, w, gu, dn), atol=1e-5, rtol=0)


def test_muon_optimizer_over_adapters():
    model = tiny()
    apply_lora(model, LoraConfig(r=4))
    opt, groups = build_optimizer(model, OptimConfig(muon=True))
    assert set(groups) == set(lora_names(model))
    model(ids(), labels=ids(seed=1)).loss.backward()
    base = {n: p.detach().clone() for n, p in model.named_parameters() if ".lora_" not in n}
    opt.step()
    for n, p in model.named_parameters():
        if n in base:
            assert torch.equal(p, base[n]), n


def test_targets_that_match_nothing_are_an_error():
    with pytest.raises(ConfigError, match="match no weight"):
        apply_lora(tiny(), LoraConfig(targets=["*.no_such_proj"]))
    with pytest.raises(ConfigError, match="lora.r"):
        apply_lora(tiny(), LoraConfig(r=0))


def test_int4_layer_passes_gradients_to_its_input():
    """QLoRA: a frozen INT4 layer's input gradient is dy @ W with W the weight its kernel multiplies by."""
    from glmstack.inference.quant import Int4Linear

    w = torch.randn(48, 64, generator=torch.Generator().manual_seed(0)) * 0.1
    layer = Int4Linear(w, None, 32)
    W = layer.dequantize(torch.float32)
    assert (W - w).abs().max() < 0.1 * w.abs().max()  # int4: close to the original, not equal
    x = torch.randn(5, 64, requires_grad=True)
    layer(x).float().pow(2).sum().backward()
    x2 = x.detach().clone().requires_grad_()
    torch.nn.functional.linear(x2.bfloat16(), W.bfloat16()).float().pow(2).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad, atol=5e-2, rtol=5e-2)


def test_qlora_expert_adapters_save_as_peft_banks(tmp_path):
    """On an INT4 base the experts are one Linear each; their adapters are written as PEFT's bank layout (gate and
    up fused at rank 2r) and load onto the unquantized base as the same per-expert deltas."""
    from glmstack.inference.quant import quantize_
    from glmstack.model.lora_peft import load_adapter, read_adapter, save_adapter

    cfg = ModelConfig.preset("tiny", num_nextn_predict_layers=0)
    q = quantize_(GLM(cfg).init_weights(seed=0), "int4")
    apply_lora(q, LoraConfig(r=2, alpha=3, use_rslora=True, targets=["experts"]))
    perturb_adapters(q)
    save_adapter(q, tmp_path)
    config, _ = read_adapter(tmp_path)
    assert config["rank_pattern"] == {
        r"model\.layers\.1\.mlp\.experts\.gate_up_proj": 4,
        r"model\.layers\.2\.mlp\.experts\.gate_up_proj": 4,
    }
    plain = GLM(cfg).init_weights(seed=0)
    load_adapter(plain, tmp_path)
    bank, per = plain.layers[1].mlp.experts, q.layers[1].mlp.experts
    for e in range(cfg.n_routed_experts):
        want = torch.cat([per[e].gate_proj.lora_delta(), per[e].up_proj.lora_delta()])
        torch.testing.assert_close(bank.lora_delta("gate_up_proj")[e], want, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(bank.lora_delta("down_proj")[e], per[e].down_proj.lora_delta(), atol=1e-6, rtol=1e-5)


def test_frozen_banks_get_no_gradient_and_the_rest_is_unchanged():
    """Adapters on attention only: the sorted experts skip the frozen banks' weight GEMMs; every adapter gradient
    equals the per-expert loop reference's."""
    grads = []
    for grouped in (True, False):
        model = GLM(ModelConfig.preset("tiny", use_grouped_mm=grouped)).init_weights(seed=0)
        apply_lora(model, LoraConfig(r=3, targets=["attention"]))
        perturb_adapters(model)
        model(ids(), labels=ids(seed=3)).loss.backward()
        assert model.layers[1].mlp.experts.gate_up_proj.grad is None
        grads.append({n: model.get_parameter(n).grad for n in lora_names(model)})
    for n, g in grads[0].items():
        torch.testing.assert_close(g, grads[1][n], atol=1e-5, rtol=1e-4, msg=n)


@pytest.mark.parametrize("targets", [["experts"], ["*mlp.experts.down_proj"], ["*mlp.experts.gate_up_proj"]])
def test_low_rank_expert_path_equals_the_merged_reference(targets):
    """LoraExperts' fast path (low-rank terms inside experts_sorted's blocks) == W + s·BA through the same kernel
    (lora_fast=False): output, and the gradients of the input, the gate weights and the adapters."""
    torch.manual_seed(0)
    experts = GLM(ModelConfig.preset("tiny")).init_weights(seed=0).layers[1].mlp.experts
    parent = torch.nn.Module()
    parent.mlp = torch.nn.Module()
    parent.mlp.experts = experts
    apply_lora(parent, LoraConfig(r=3, alpha=5, targets=targets))
    perturb_adapters(parent)
    T, K, E = 40, 2, experts.n_experts
    x = torch.randn(T, experts.gate_up_proj.shape[2])
    idx = (torch.rand(T, E) * torch.linspace(1, 0, E)).topk(K, dim=-1).indices  # last experts rarely or never chosen
    w = torch.rand(T, K)
    results = []
    for fast in (True, False):
        experts.lora_fast = fast
        xx, ww = x.clone().requires_grad_(), w.clone().requires_grad_()
        experts(xx, idx, ww).pow(2).sum().backward()
        grads = [p.grad.clone() for p in parent.parameters() if p.requires_grad]
        results.append([experts(x, idx, w).detach(), xx.grad, ww.grad, *grads])
        parent.zero_grad()
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


@pytest.mark.skipif(not hasattr(torch, "_grouped_mm"), reason="torch without _grouped_mm")
def test_grouped_mm_low_rank_terms_equal_the_merged_loop():
    """experts_grouped_mm's adapter terms (what a GPU runs; torch's CPU _grouped_mm here) == the loop reference on
    W + s·BA, forward and the adapters' gradients."""
    from glmstack.model.moe import experts_grouped_mm

    g = torch.Generator().manual_seed(0)
    E, D, F_, r, T, K = 8, 32, 16, 8, 30, 2
    W_gu, W_d = torch.randn(E, 2 * F_, D, generator=g) * 0.2, torch.randn(E, D, F_, generator=g) * 0.2
    ab = [torch.randn(*s, generator=g) * 0.2 for s in ((E, r, D), (E, 2 * F_, r), (E, r, F_), (E, D, r))]
    x, w = torch.randn(T, D, generator=g), torch.rand(T, K, generator=g)
    idx = torch.rand(T, E, generator=g).topk(K, dim=-1).indices
    out = []
    for fast in (True, False):
        lora = [t.clone().requires_grad_() for t in ab]
        if fast:
            y = experts_grouped_mm(x, idx, w, W_gu, W_d, lora=lora)
        else:
            y = experts_loop(x, idx, w, W_gu + lora[1] @ lora[0], W_d + lora[3] @ lora[2])
        y.pow(2).sum().backward()
        out.append([y.detach()] + [t.grad for t in lora])
    for a, b in zip(*out):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
