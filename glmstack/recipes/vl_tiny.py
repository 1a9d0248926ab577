"""The tiny multimodal recipe (GLM-4.1V-Thinking, arXiv 2507.01006 §4-5, at laptop scale) on the PIL visual QA set:
ViT pre-training on the images' attributes -> adapter-only alignment -> full SFT -> RLCS-style curriculum RL with the
boxed-answer reward.

    glmstack vl-recipe vl_tiny                       # all four stages + report (runs/vl_tiny/report.md)
    glmstack vl-train vl_tiny --stage vit            # one stage (vit, align, sft)
    glmstack vl-rl vl_tiny                           # the RL stage alone (after sft)

The model: glmstack.model.vision's tiny-glm4.5v (a 3-layer MoE decoder of width 64, a 2-block ViT of width 64) with
4-pixel patches; the processor resizes every image to 1536-2048 pixels (smart_resize counts both frames of the
two-frame clip against vl.max_pixels), 24-32 visual tokens after the 2x2 merge. 4-pixel rather than 8-pixel
patches: a shape then spans several patches with its edges inside them (docs/multimodal.md).
The ViT is pre-trained first (GLM-4.1V starts from a pre-trained encoder; multimodal/vit_pretrain.py): trained only
through the decoder's answers, a random ViT learns colours at once but shapes, counts and letters slowly.
"""

from __future__ import annotations

import dataclasses

from glmstack.multimodal.config import ViTConfig, VLOptions, VLTrainConfig

RUN = "vl_tiny"
VISION = {"patch_size": 4, "image_size": 64, "hidden_size": 64, "num_heads": 4, "intermediate_size": 128}


def _base(stage: str, steps: int, lr: float, train: str, init_from: str = "", kind=VLTrainConfig) -> VLTrainConfig:
    cfg = kind(run=RUN, stage=stage, seq_len=128, micro_batch_size=16, steps=steps, init_from=init_from,
                        vl=VLOptions(train=train, model_overrides={"vision_config": dict(VISION)}))  # fmt: skip
    cfg.optim.lr = lr
    cfg.schedule = dataclasses.replace(cfg.schedule, warmup_steps=min(20, steps // 10), mtp_weight=[[0, 0.0]],
                                       balance_rate=[[0, 1e-3]], aux_loss_weight=0.0)  # fmt: skip
    cfg.ckpt.every, cfg.ckpt.keep_last, cfg.log.every = 0, 1, 10
    return cfg


def vit() -> ViTConfig:
    """The ViT + adapter learn the scenes' attributes through classification heads (multimodal/vit_pretrain.py)."""
    cfg = _base("vit", steps=1200, lr=3e-2, train="vision", kind=ViTConfig)
    cfg.micro_batch_size = 64
    return cfg


def align() -> VLTrainConfig:
    """The adapter alone learns to feed the pre-trained ViT's features to the (frozen, fresh) decoder."""
    return _base("align", steps=60, lr=3e-3, train="adapter", init_from=f"{RUN}/vit/model")


def sft() -> VLTrainConfig:
    """Everything trains on the visual QA chats, from the aligned model."""
    return _base("sft", steps=1000, lr=1.5e-3, train="all", init_from=f"{RUN}/align/model")


def rl():
    """RLCS on the SFT model: GRPO groups of 8 on colours/shapes, then all kinds, then only the groups the policy
    finds hard (its first 4 samples fail, a later one succeeds)."""
    from glmstack.multimodal.rl import VLRLConfig
    from glmstack.posttrain.rl.stage import RLOptions

    cfg = VLRLConfig(run=RUN, stage="rl", init_from=f"{RUN}/sft/model", seq_len=128, micro_batch_size=16,
                     grad_accum=2, steps=30, vl=VLOptions(model_overrides={"vision_config": dict(VISION)}),
                     rl=RLOptions(task="vqa", samples_per_step=32, curriculum=[[0, 0, 8], [10, 1, 8],
                                                                                      [20, 1, 8, 4]],
                                  max_new_tokens=8, temperature=1.0, heldout_n=32, heldout_level=1,
                                  eval_every=10))  # fmt: skip
    cfg.optim.lr = 2e-4
    cfg.schedule = dataclasses.replace(cfg.schedule, lr="constant", warmup_steps=0, mtp_weight=[[0, 0.0]],
                                       balance_rate=[[0, 1e-3]], aux_loss_weight=0.0)  # fmt: skip
    cfg.ckpt.every, cfg.ckpt.keep_last, cfg.log.every = 0, 1, 1
    return cfg
