"""The tiny multimodal recipe end to end at smoke size (vit -> align -> SFT -> RL -> report), and the RL data: every
micro-batch carries its rows' pixels; the rollout log-probs are the batched sampler's own (close to the trainer's
recomputation in fp32, far from it when `rl.rollout_noise` perturbs the rollout copy: IcePop has work to do)."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("glmstack.model.vision")  # the model half (branch vlmodel) until it is merged

from glmstack.cli import main as glmstack
from glmstack.multimodal.processor import VisionProcessor
from glmstack.multimodal.rl import VisualQA
from glmstack.posttrain.rl.losses import token_logprobs
from glmstack.posttrain.rl.rollouts import Rollouts
from glmstack.recipes.vl_tiny import rl
from glmstack.tokenizer import Tokenizer
from glmstack.train.loop import VISION_INPUTS


def _mismatch(vl_folder, noise: float) -> float:
    """The largest |trainer log-prob − rollout log-prob| over a step's sampled tokens, `rl.rollout_noise` = noise."""
    from glmstack.model.vision import load_vl_hf

    model = load_vl_hf(vl_folder, dtype=torch.float32)
    tok, proc = Tokenizer.load(vl_folder), VisionProcessor.load(vl_folder)
    cfg = rl()
    cfg.rl.samples_per_step, cfg.rl.eval_every, cfg.rl.heldout_n, cfg.rl.max_new_tokens = 8, 0, 1, 4
    cfg.rl.temperature, cfg.rl.rollout_noise = 1.0, noise
    data = Rollouts(model=model, task=VisualQA(tok, proc), opts=cfg.rl, seed=0, micro_batches=2, tokenizer=tok)
    batches = data.make_step()
    assert len(batches) == 2
    worst = 0.0
    with torch.no_grad():
        for b in batches:
            assert b["image_grid_thw"].shape == (4, 3)  # one image per row
            assert b["mask"].sum() > 0
            logits = model(b["input_ids"], **{k: b[k] for k in VISION_INPUTS if k in b}).logits.float()
            logp = token_logprobs(logits, b["targets"], b["temperature"])
            worst = max(worst, float(((logp - b["rollout_logp"]).abs() * b["mask"]).max()))
    return worst


def test_rl_micro_batches_carry_pixels_and_the_samplers_logprobs(vl_folder):
    assert _mismatch(vl_folder, 0.0) < 1e-4  # the batched fp32 sampler against the trainer's packed forward
    assert _mismatch(vl_folder, 0.3) > 1e-3  # a perturbed rollout copy: the sampler's log-probs, not a re-score


def test_vl_rl_refuses_what_it_cannot_honour():
    from glmstack.config import ConfigError
    from glmstack.multimodal.rl import check

    for field, value in [("task", "arithmetic"), ("rollout_server", "http://127.0.0.1:1")]:
        cfg = rl()
        cfg.init_from = "somewhere"
        setattr(cfg.rl, field, value)
        with pytest.raises(ConfigError, match=f"rl.{field}"):
            check(cfg)


@pytest.mark.slow
def test_recipe_runs_every_stage_and_writes_the_report(tmp_path, capsys):
    small = ["--set", f"out_dir={tmp_path}", "--set", "vl.eval_n=4", "--set", "vl.synthetic_n=24",
             "--set", "log.progress=false", "--set", "micro_batch_size=4"]  # fmt: skip
    code = glmstack(["vl-recipe", "vl_tiny", *small, "--vit", "steps=2", "--align", "steps=2", "--sft", "steps=2", "--rl", "steps=1",
                     "--rl", "rl.samples_per_step=8", "--rl", "rl.heldout_n=2", "--rl", "rl.max_new_tokens=4",
                     "--rl", "grad_accum=1"])  # fmt: skip
    assert code == 0
    run = tmp_path / "vl_tiny"
    rows = json.loads((run / "report.json").read_text())
    assert [r["stage"] for r in rows] == ["vit", "align", "sft", "rl"]
    assert all(r["eval"]["n"] == 4 for r in rows)
    report = (run / "report.md").read_text()
    assert "| vit | ViT+heads |" in report and "| align | adapter |" in report and "![](samples/00.png)" in report
    assert (run / "samples" / "00.png").is_file() and (run / "rl" / "model" / "preprocessor_config.json").is_file()
    # a re-run skips the finished stages
    assert glmstack(["vl-recipe", "vl_tiny", *small]) == 0
    assert "vit: already done" in capsys.readouterr().out


def _vl_rl(vl_folder, out, *extra) -> list[dict]:
    """`glmstack rl vl_tiny` (the recipe's rl() is a VLRLConfig: stage_cli runs VL RL) -> its metrics rows."""
    args = ["rl", "vl_tiny", "--set", f"init_from={vl_folder}", "--set", f"out_dir={out}", "--set", "steps=3",
            "--set", "rl.samples_per_step=8", "--set", "rl.curriculum=[[0, 0, 4]]", "--set", "rl.max_new_tokens=4",
            "--set", "rl.heldout_n=2", "--set", "rl.eval_every=0", "--set", "grad_accum=1", "--set",
            "micro_batch_size=8", "--set", "log.plots=false", "--set", "log.progress=false", "--set", "vl.eval_n=0",
            "--set", "rl.entropy_coef=0.05", *extra]  # the entropy bonus: a gradient though the rewards may all be 0
    assert glmstack(args) == 0
    return [json.loads(x) for x in (out / "vl_tiny" / "rl" / "metrics.jsonl").read_text().splitlines()]


def test_rl_command_runs_vl_rl_with_its_mismatch_on_the_dashboard(vl_folder, tmp_path):
    """Issue 35: with rl.rollout_noise the VL run's dashboard shows the mismatch and IcePop masking every step; with
    noise 0 the first-step invariants hold (rollout = trainer log-probs in fp32, PPO KL exactly 0); --stop-at and
    --resume on a VL stage continue bit for bit."""
    noisy = _vl_rl(vl_folder, tmp_path / "noisy", "--set", "rl.rollout_noise=1.0", "--set", "rl.mismatch_high=1.05",
                   "--set", "rl.mismatch_low=0.95")  # fmt: skip
    assert len(noisy) == 3
    assert all(r["mean_abs_logp_diff"] > 1e-3 for r in noisy) and sum(r["mismatch_masked_frac"] for r in noisy) > 0
    clean = _vl_rl(vl_folder, tmp_path / "clean")
    assert clean[0]["mean_abs_logp_diff"] < 1e-4 and clean[0]["ppo_kl"] == 0.0
    assert clean[0]["mismatch_masked_frac"] == 0.0
    assert glmstack(["rl", "vl_tiny", "--set", f"init_from={vl_folder}", "--print-config"]) == 0
    _ = _vl_rl(vl_folder, tmp_path / "split", "--stop-at", "1")
    resumed = _vl_rl(vl_folder, tmp_path / "split")
    assert [r["loss"] for r in resumed] == [r["loss"] for r in clean]
    assert [r["grad_norm"] for r in resumed] == [r["grad_norm"] for r in clean] and clean[-1]["grad_norm"] > 0


def test_vl_sft_and_rl_with_lora(vl_folder, tmp_path):
    """Issue 37 on the vision-language stages: `lora.enabled` puts adapters inside the part `vl.train` names (here
    the language model), only they train, the stage exports a PEFT folder (+ tokenizer, processor) that
    `load_adapter` puts back on the base; VL RL trains a LoRA policy whose rollout copy carries the adapters."""
    from safetensors.torch import load_file

    from glmstack.model.lora_peft import load_adapter
    from glmstack.model.vision import load_vl_hf

    common = ["--set", f"init_from={vl_folder}", "--set", "lora.enabled=true", "--set", "lora.r=4", "--set",
              "optim.muon=false", "--set", "optim.lr=1e-2", "--set", "vl.eval_n=0", "--set", "log.plots=false",
              "--set", "log.progress=false"]  # fmt: skip
    assert glmstack(["vl-train", "vl_tiny", "--stage", "sft", "--set", f"out_dir={tmp_path}", "--set", "steps=2",
                     "--set", "vl.train=language", *common]) == 0  # fmt: skip
    model = tmp_path / "vl_tiny" / "sft" / "model"
    assert (model / "adapter_config.json").is_file() and (model / "preprocessor_config.json").is_file()
    tensors = load_file(str(model / "adapter_model.safetensors"))
    assert tensors and all(k.startswith("base_model.model.model.language_model.") for k in tensors)
    assert any("lora_B" in k and t.abs().max() > 0 for k, t in tensors.items())  # trained
    base = load_vl_hf(vl_folder, dtype=torch.float32)
    assert any(".experts.lora_A." in n for n in load_adapter(base, model))
    rows = _vl_rl(vl_folder, tmp_path / "rl", *common)
    assert len(rows) == 3 and rows[-1]["grad_norm"] > 0
    assert (tmp_path / "rl" / "vl_tiny" / "rl" / "model" / "adapter_config.json").is_file()
