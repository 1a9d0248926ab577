"""`lora.*` on a training stage: only the adapters train and reach the optimiser, the base (balancing biases
included) stays bit-identical, the checkpoint is a PEFT adapter folder naming its base, resume is bit-exact, and
QLoRA trains on an INT4 base."""

import json
import math

import pytest
import torch
from safetensors.torch import load_file

from glmstack.model import GLM, ModelConfig
from glmstack.model.lora import lora_names
from glmstack.model.lora_peft import load_adapter
from glmstack.recipes import load_config
from glmstack.train import checkpoint
from glmstack.train.stage import model_and_optimizer, run

FAST = [
    "seq_len=32", "micro_batch_size=2", "grad_accum=2", "schedule.warmup_steps=2", "log.progress=false",
    "log.plots=false", "ckpt.every=0", "log.val_every=0", "schedule.batch_warmup_tokens=0", "optim.lr=3e-3",
    "lora.enabled=true", "lora.r=4", "lora.dropout=0.1",
]  # fmt: skip


def _cfg(tmp_path, name, *extra):
    return load_config("tiny", "pretrain", FAST + [f"out_dir={tmp_path}", f"run={name}", "steps=6", *extra])


def _losses(tmp_path, name):
    rows = [json.loads(line) for line in (tmp_path / name / "pretrain" / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in rows]


def test_only_adapters_train_and_the_checkpoint_is_an_adapter(tmp_path):
    cfg = _cfg(tmp_path, "a")
    model, optimizer = model_and_optimizer(cfg)
    in_opt = {id(p) for g in optimizer.param_groups for p in g["params"]}
    assert in_opt == {id(model.get_parameter(n)) for n in lora_names(model)}
    base = GLM(ModelConfig.preset("tiny")).init_weights(seed=0)
    run(cfg)
    folder = checkpoint.latest(tmp_path / "a" / "pretrain")
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "glmstack:preset=tiny,seed=0"
    assert not list(folder.glob("model*.safetensors"))
    tensors = load_file(str(folder / "adapter_model.safetensors"))
    assert any(".mlp.experts.base_layer.lora_B.weight" in k for k in tensors)
    assert all(t.abs().sum() > 0 for k, t in tensors.items() if "lora_B" in k)  # every adapter moved
    # the base as it was: the same model + the adapter == what training ended with (its last loss, recomputed)
    ref = GLM(ModelConfig.preset("tiny")).init_weights(seed=0)
    before = {k: v.clone() for k, v in ref.state_dict().items()}
    load_adapter(ref, folder)
    assert all(torch.equal(before[k], v) for k, v in ref.state_dict().items() if k in before)
    assert all(torch.equal(before[k], v) for k, v in base.state_dict().items())
    losses = [loss for _, loss in _losses(tmp_path, "a")]
    assert losses[-1] < losses[0]


def test_lora_resume_is_bit_exact(tmp_path):
    run(_cfg(tmp_path, "straight"))
    assert run(_cfg(tmp_path, "resumed"), stop_at=3)["step"] == 3
    run(_cfg(tmp_path, "resumed"))
    a, b = (load_file(str(checkpoint.latest(tmp_path / n / "pretrain") / "adapter_model.safetensors"))
            for n in ("straight", "resumed"))  # fmt: skip
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert _losses(tmp_path, "straight") == _losses(tmp_path, "resumed")


def test_qlora_on_int4_base(tmp_path):
    result = run(_cfg(tmp_path, "q", "steps=3", "lora.base_quant=int4", "lora.dropout=0.0"))
    assert result["step"] == 3
    losses = [loss for _, loss in _losses(tmp_path, "q")]
    assert all(math.isfinite(loss) for loss in losses)
    folder = checkpoint.latest(tmp_path / "q" / "pretrain")
    assert (folder / "adapter_model.safetensors").is_file()


@pytest.mark.parametrize("preset", ["tiny-glm5", "tiny-glm47-flash"])
def test_qlora_on_an_int4_mla_base(preset, tmp_path):
    """QLoRA on MLA (GLM-5 with DSA, GLM-4.7-Flash): every latent projection, kv_b_proj and the indexer held in INT4,
    adapters on attention (kv_b_proj included: that layer decodes on the plain path), MLPs and experts; the loss
    falls and the checkpoint is an adapter folder."""
    shape = '{"kv_lora_rank": 32, "qk_rope_head_dim": 16}'  # int4: inputs a multiple of 32, outputs of 16
    result = run(_cfg(tmp_path, "q", "steps=6", f"model={preset}", f"model_overrides={shape}", "lora.base_quant=int4",
                      "lora.dropout=0.0", "optim.muon=false", "optim.lr=1e-2"))  # fmt: skip
    assert result["step"] == 6
    losses = [loss for _, loss in _losses(tmp_path, "q")]
    assert all(math.isfinite(loss) for loss in losses) and losses[-1] < losses[0]
    folder = checkpoint.latest(tmp_path / "q" / "pretrain")
    keys = load_file(str(folder / "adapter_model.safetensors"))
    assert any("kv_b_proj.lora_A" in k for k in keys) and any("experts" in k for k in keys)


def test_a_later_stage_from_an_adapter_is_told_to_merge(tmp_path):
    from glmstack.config import ConfigError

    run(_cfg(tmp_path, "a", "steps=1"))
    with pytest.raises(ConfigError, match="is a LoRA adapter.*glmstack merge"):
        run(load_config("tiny", "midtrain", FAST[:-3] + [f"out_dir={tmp_path}", "run=a", "init_from=a/pretrain"]))


def test_stages_without_lora_refuse_it():
    """The ViT pre-training stage trains its encoder and heads in full: lora.* is refused, not ignored (the reward
    model and the other VL stages take it: tests/posttrain/test_rm.py, tests/multimodal/test_recipe.py)."""
    from glmstack.config import ConfigError
    from glmstack.multimodal.vit_pretrain import run_vit

    with pytest.raises(ConfigError, match="vit stage pre-trains"):
        run_vit(load_config("vl_tiny", "vit", ["lora.enabled=true"]))
