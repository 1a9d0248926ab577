"""A Bradley–Terry reward model from the speedrun's SFT model on the synthetic checkable preference set.

`init_from` is the SFT stage's model folder (`glmstack sft sft_speedrun` writes runs/speedrun/sft/model); the RM keeps
its trunk and adds a scalar head. Sizes fit a few minutes on the shared 2-core machine (docs/rl.md has the figures).

    glmstack rm rm_speedrun
    glmstack rm rm_speedrun --set init_from=/path/to/sft/model --set run=rm1
"""

from __future__ import annotations

import dataclasses

from glmstack.posttrain.rm.stage import RMConfig, RMOptions


def rm() -> RMConfig:
    cfg = RMConfig(run="speedrun", stage="rm", init_from="speedrun/sft/model", seq_len=64, micro_batch_size=32,
                   grad_accum=1, steps=200, rm=RMOptions(synthetic_n=4000))  # fmt: skip
    cfg.optim.lr = 1e-3
    cfg.schedule = dataclasses.replace(cfg.schedule, lr="cosine", warmup_steps=10, mtp_weight=[[0, 0.0]])
    cfg.ckpt.every, cfg.ckpt.keep_last, cfg.log.val_every, cfg.log.val_batches = 50, 2, 25, 8
    return cfg
