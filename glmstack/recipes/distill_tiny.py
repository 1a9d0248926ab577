"""On-policy distillation into a random tiny GLM on the token task: the smoke test of `glmstack distill` and its tests.

A teacher is any model folder whose vocabulary covers the token task's ids (>= 32):

    glmstack distill distill_tiny --set 'distill.teachers=[{"model": "FOLDER", "task": "toy"}]' --set steps=4
"""

from __future__ import annotations

import dataclasses

from glmstack.posttrain.rl.distill import DistillConfig, DistillOptions, distill_rl_options


def distill() -> DistillConfig:
    cfg = DistillConfig(run="tiny", stage="distill", model="tiny", seq_len=16, micro_batch_size=8, grad_accum=2,
                        steps=10, distill=DistillOptions(),
                        rl=distill_rl_options(task="toy", samples_per_step=16, max_new_tokens=4,
                                     heldout_n=8, eval_every=5))  # fmt: skip
    cfg.optim.lr = 3e-3
    cfg.schedule = dataclasses.replace(cfg.schedule, lr="constant", warmup_steps=0, mtp_weight=[[0, 0.0]],
                                       balance_rate=[[0, 0.0]], aux_loss_weight=0.0)  # fmt: skip
    cfg.ckpt.every, cfg.ckpt.keep_last, cfg.log.progress = 0, 2, False
    return cfg
