"""`glmstack sft` and `glmstack dpo` with `lora.enabled=true`: the stage trains adapters only and exports the adapter folder (with
the tokenizer) naming its base; `glmstack merge` turns it into a full model that differs from the base."""

import json

import pytest
import torch

from glmstack.cli import main
from glmstack.model import load_hf
from glmstack.posttrain import sft
from glmstack.recipes import load_config
from tests.posttrain.test_sft_stage import overrides

pytestmark = pytest.mark.slow


def test_sft_with_lora_exports_an_adapter_that_merges(base_dir, tmp_path):
    extra = {"lora.enabled": "true", "lora.r": 4, "optim.muon": "false", "optim.lr": "3e-3"}
    result = sft.run_sft(load_config("sft_speedrun", "sft", overrides(base_dir, tmp_path, steps=3, **extra)))
    model_dir = tmp_path / "speedrun" / "sft" / "model"
    assert result["stopped"] == "done" and result["model"] == str(model_dir)
    config = json.loads((model_dir / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(base_dir.resolve())
    assert (model_dir / "tokenizer.json").exists() and not list(model_dir.glob("model*.safetensors"))
    assert main(["merge", str(base_dir), str(model_dir), "--out", str(tmp_path / "merged")]) == 0
    base, merged = load_hf(base_dir), load_hf(tmp_path / "merged")
    ids = torch.arange(1, 33)[None]
    with torch.no_grad():
        assert (base(ids).logits - merged(ids).logits).abs().max() > 1e-3


def test_dpo_with_lora_starts_at_its_reference_and_exports_an_adapter(base_dir, tmp_path):
    """DPO's frozen reference is the base (train.stage.initial_model), which a fresh adapter equals: loss ln 2 at
    step 1; the export is the adapter folder."""
    import math

    from glmstack.cli import main as cli
    from tests.posttrain.test_dpo import args, rows

    extra = ["lora.enabled=true", "lora.r=4", "optim.muon=false", "optim.lr=3e-3", "steps=3", "dpo.val_data=[]"]
    assert cli(args(base_dir, tmp_path, *[a for kv in extra for a in ("--set", kv)])) == 0
    stage = tmp_path / "tiny" / "dpo"
    first, last = rows(stage)[0], rows(stage)[-1]
    assert abs(first["loss"] - math.log(2)) < 1e-6 and last["loss"] < first["loss"]
    assert (stage / "model" / "adapter_model.safetensors").exists() and not (
        stage / "model" / "model.safetensors"
    ).exists()
