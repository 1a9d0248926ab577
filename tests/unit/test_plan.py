"""`glmstack plan` (issue 37's memory planner): its activation model, fitted on cuts (1 layer, 2, 2 + MTP) at T = 32 / 64 / 128,
predicts what autograd saves in the whole model at another length; its parameter counts are LoRA's own; the command
prints a row per model."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from glmstack.model import GLM, ModelConfig
from glmstack.model.lora import LoraConfig, apply_lora
from glmstack.train.plan import activation_bytes, activation_fit, parameter_counts, plan, random_model, saved_bytes


@pytest.mark.parametrize("preset", ["tiny-moe", "tiny-glm5"])
def test_the_activation_fit_predicts_the_whole_model(preset):
    cfg = dataclasses.replace(ModelConfig.preset(preset), vocab_size=256)
    fit = activation_fit(cfg)
    for tokens in (96, 200):
        lin, quad = activation_bytes(cfg, fit, tokens)
        direct = saved_bytes(random_model(cfg), tokens)  # every layer (MTP included), at a length the fit never saw
        assert abs(lin + quad - direct) / direct < 0.05, (tokens, lin + quad, direct)


def test_parameter_counts_are_what_lora_trains():
    cfg = ModelConfig.preset("tiny-moe")
    got = parameter_counts(cfg, 4, ["attention", "experts"])
    model = GLM(cfg, dtype=torch.float32).materialize("cpu")
    total = sum(p.numel() for p in model.parameters())
    apply_lora(model, LoraConfig(enabled=True, r=4, alpha=8, targets=["attention", "experts"]), seed=0)
    assert got["total"] == total
    assert got["trainable"] == sum(p.numel() for p in model.parameters() if p.requires_grad) > 0
    assert parameter_counts(cfg, 0, [])["trainable"] == total  # full fine-tuning trains everything


def test_plan_terms_and_the_command(capsys):
    row = plan("tiny-moe", gpus=2, seq_len=128, micro_batch=2, lora_r=4, targets=["attention"], base="int4")
    b = row["bytes"]
    assert b["weights"] == pytest.approx(row["total_params"] * (0.5 + 2 / 128) / 2)
    assert b["trainable"] == row["trainable_params"] * 16 / 2 and row["mode"] == "lora r4 int4"
    assert row["fits"] == {"H100": True, "H200": True}
    from glmstack.cli import main as glmstack

    assert glmstack(["plan", "tiny-moe", "--seq-len", "64", "--full"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Computed (not measured on a GPU)") and "| tiny-moe | full |" in out
