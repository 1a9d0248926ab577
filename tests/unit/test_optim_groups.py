"""Parameter groups: every parameter in exactly one optimiser, GLM-4.5's rules, every preset on meta."""

import pytest
import torch
from torch import nn

from glmstack.optim.groups import assign_groups, build_optimizer
from glmstack.train.config import OptimConfig


class Toy(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(10, 8)
        self.q_proj = nn.Linear(8, 8, bias=True)
        self.norm = nn.LayerNorm(8)
        self.mlp = nn.Module()
        self.mlp.gate = nn.Linear(8, 4, bias=False)  # router
        self.experts = nn.Parameter(torch.zeros(4, 16, 8))  # (E, out, in) bank
        self.lm_head = nn.Linear(8, 10, bias=False)


def test_rules_and_options():
    groups = assign_groups(Toy())
    assert groups == {
        "embed_tokens.weight": "adamw",
        "q_proj.weight": "muon",
        "q_proj.bias": "adamw",
        "norm.weight": "adamw",
        "norm.bias": "adamw",
        "mlp.gate.weight": "muon",
        "experts": "muon",
        "lm_head.weight": "adamw",
    }
    flipped = assign_groups(Toy(), lm_head="muon", router="adamw")
    assert flipped["lm_head.weight"] == "muon" and flipped["mlp.gate.weight"] == "adamw"


def test_build_optimizer_covers_every_parameter_once():
    model = Toy()
    opt, _ = build_optimizer(model, OptimConfig(muon_split={"q_proj.weight": 2}))
    ids = [id(p) for g in opt.param_groups for p in g["params"]]
    assert len(ids) == len(set(ids)) and set(ids) == {id(p) for p in model.parameters()}
    assert any(g.get("blocks") == (2, (g["params"][0].shape[0] // 2,)) for g in opt.optimizers["muon"].param_groups)
    assert all(g["initial_lr"] == g["lr"] for g in opt.param_groups)


def test_every_preset_on_meta():
    from glmstack.model import GLM, ModelConfig
    from glmstack.model.config import PRESETS

    for name in PRESETS:
        model = GLM(ModelConfig.preset(name))  # built on meta (the Model contract)
        groups = assign_groups(model)
        # every trainable parameter (GLM-5's DSA indexers are frozen outside their training stages)
        assert set(groups) == {n for n, p in model.named_parameters() if p.requires_grad}, name
        assert groups.get("model.embed_tokens.weight", "adamw") == "adamw"
        assert "muon" in groups.values() and "adamw" in groups.values()


def test_ns_dtype_auto_is_bf16_only_where_the_hardware_multiplies_in_bf16():
    from pathlib import Path

    from glmstack.optim.groups import ns_dtype

    assert ns_dtype("bfloat16", torch.device("cpu")) is torch.bfloat16
    assert ns_dtype("float32", torch.device("cuda")) is torch.float32
    assert ns_dtype("auto", torch.device("cuda")) is torch.bfloat16
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    flags = next((line.split() for line in info.splitlines() if line.startswith("flags")), [])
    native = "avx512_bf16" in flags or "amx_bf16" in flags
    assert ns_dtype("auto", torch.device("cpu")) is (torch.bfloat16 if native else torch.float32)
