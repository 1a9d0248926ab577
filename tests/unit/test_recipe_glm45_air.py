"""The real-size recipe resolves from the CLI, its model config validates and its optimiser groups hold, all on
the meta device (nothing of GLM-4.5-Air's 109B parameters is allocated)."""

import json

import pytest

from glmstack.cli import main
from glmstack.model import GLM, ModelConfig
from glmstack.optim.groups import assign_groups
from glmstack.recipes import recipe_function

RECIPE = "glm45_air_8xh100"


@pytest.mark.parametrize("stage", ["pretrain", "midtrain"])
def test_print_config_resolves(stage, capsys):
    assert main([stage, RECIPE, "--print-config"]) == 0
    cfg = json.loads(capsys.readouterr().out)
    assert cfg["model"] == "glm-4.5-air" and cfg["optim"]["muon"] and cfg["optim"]["lr"] == 2.5e-4
    assert cfg["dist"] == {"dp": "fsdp", "expert_parallel": True, "ep": 0, "find_unused_parameters": False}
    assert cfg["dtype"] == "bfloat16"
    want = {"pretrain": (4096, 1e4, 0.3, 1e-3), "midtrain": (32768, 1e6, 0.1, 0.0)}[stage]
    got = (
        cfg["seq_len"],
        cfg["rope_theta"],
        cfg["schedule"]["mtp_weight"][0][1],
        cfg["schedule"]["balance_rate"][0][1],
    )
    assert got == want


def test_stages_continue_one_schedule():
    pre, mid = recipe_function(RECIPE, "pretrain")(), recipe_function(RECIPE, "midtrain")()
    assert pre.schedule.total_steps == mid.schedule.total_steps == pre.steps + mid.steps
    assert mid.schedule.step_offset == pre.steps and mid.init_from == f"{pre.run}/pretrain"
    assert pre.seq_len * pre.grad_accum == mid.seq_len * mid.grad_accum  # the same tokens per step
    assert pre.schedule.mtp_weight[-1][1] == 0.1 and pre.schedule.balance_rate[-1][1] == 0.0


@pytest.mark.parametrize("stage", ["pretrain", "midtrain"])
def test_model_validates_and_groups_hold_on_meta(stage):
    cfg = recipe_function(RECIPE, stage)()
    model_cfg = ModelConfig.preset(cfg.model, **cfg.model_overrides, rope_theta=cfg.rope_theta)
    assert model_cfg.max_position_embeddings >= cfg.seq_len
    model = GLM(model_cfg)  # built on meta (the Model contract)
    assert all(p.is_meta for p in model.parameters())
    groups = assign_groups(model, lm_head=cfg.optim.lm_head, router=cfg.optim.router)
    assert set(groups) == {n for n, p in model.named_parameters() if p.requires_grad}
    assert groups["embed_tokens.weight"] == groups["lm_head.weight"] == groups["norm.weight"] == "adamw"
    experts = [n for n in groups if ".mlp.experts." in n]  # routed expert banks (E, out, in)
    assert len(experts) == 2 * (model_cfg.num_hidden_layers - model_cfg.first_k_dense_replace + 1)  # + MTP layer
    assert all(groups[n] == "muon" for n in experts) and all(v == "adamw" for n, v in groups.items() if "bias" in n)
