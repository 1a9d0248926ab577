"""DPO from the speedrun's SFT model on the synthetic checkable preference set (the pairs `glmstack rm rm_speedrun`
trains on: a sorted list over a near miss, a valid tool call over a broken one).

`init_from` is the SFT stage's model folder (`glmstack sft sft_speedrun` writes runs/speedrun/sft/model); the
reference is that model, frozen. <stage>/dpo_summary.json has the held-out accuracies.

    glmstack dpo dpo_speedrun
    glmstack dpo dpo_speedrun --set init_from=/path/to/sft/model --set run=dpo1 --set seed=1
"""

from __future__ import annotations

import dataclasses

from glmstack.posttrain.dpo.stage import DPOConfig, DPOOptions


def dpo() -> DPOConfig:
    cfg = DPOConfig(run="speedrun", stage="dpo", init_from="speedrun/sft/model", seq_len=64,
                    micro_batch_size=16, grad_accum=1, steps=100,
                    dpo=DPOOptions(synthetic_n=2000, beta=0.1))  # fmt: skip
    cfg.optim.lr = 1e-4
    cfg.schedule = dataclasses.replace(cfg.schedule, lr="cosine", warmup_steps=10, mtp_weight=[[0, 0.0]],
                                       aux_loss_weight=0.0)  # fmt: skip
    cfg.ckpt.every, cfg.ckpt.keep_last, cfg.log.val_every, cfg.log.val_batches = 50, 2, 25, 8
    return cfg
