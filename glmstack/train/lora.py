"""LoRA and QLoRA in a training stage: the adapters go on the stage's model before it is parallelised and filled.

Why here: stage.build_model builds every stage's model (pretrain, SFT, RL, agentic RL, distillation, reward model
all go through it), so one call gives all of them `lora.*` (TrainConfig.lora, model/lora.py). The base stays frozen
and only the adapters reach the optimiser (glmstack.optim keeps parameters that require grad); the loop leaves the
MoE balancing biases alone (loop.py), so the base the adapter was trained on is exactly the base it is saved against.

    glmstack sft tiny --set lora.enabled=true lora.r=16 optim.muon=false
"""

from __future__ import annotations

import itertools

import torch

from glmstack.model import lora


def adapt(model, tensors, cfg):
    """Put adapters on the meta-built `model`; -> the fill stream with the adapters' initial values appended (each
    rank draws the same ones and keeps its part, as for the base: dist.materialize)."""
    lora.apply_lora(model, cfg.lora, seed=cfg.seed)
    model.lora_base = base_reference(cfg)
    return itertools.chain(tensors, lora.initial_tensors(model, cfg.seed))


def qlora_model(model, tensors, cfg, device: torch.device):
    """QLoRA: fill the base, quantize it (glmstack.inference.quant: int4 or fp8, frozen), then add the adapters in
    full precision. Every rank holds the whole quantized base (DDP replicates it; TrainConfig's checks refuse FSDP2
    and expert parallel with lora.base_quant)."""
    from glmstack.inference.quant import quantize_
    from glmstack.train import dist

    dist.materialize(model, device, tensors)
    quantize_(model, cfg.lora.base_quant)
    lora.apply_lora(model, cfg.lora, seed=cfg.seed)
    model.lora_base = base_reference(cfg)
    return model


def base_reference(cfg) -> str:
    """What the adapter is saved against: the init_from folder, or the preset and seed of a fresh base."""
    if cfg.init_from:
        from glmstack.train import checkpoint

        return str(checkpoint.resolve(cfg.init_from, cfg.out_dir).resolve())
    return f"glmstack:preset={cfg.model},seed={cfg.seed}"
