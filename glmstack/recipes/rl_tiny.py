"""RL on a random tiny GLM with the token task (no tokenizer): the smoke test of `glmstack rl` and its tests.

glmstack rl rl_tiny --set steps=4
"""

from __future__ import annotations

import dataclasses

from glmstack.posttrain.rl.stage import RLConfig, RLOptions


def rl() -> RLConfig:
    cfg = RLConfig(run="tiny", stage="rl", model="tiny", seq_len=16, micro_batch_size=8, grad_accum=2, steps=10,
                   rl=RLOptions(task="toy", samples_per_step=16, curriculum=[[0, 0, 4]], max_new_tokens=4,
                                heldout_n=8, eval_every=5))  # fmt: skip
    cfg.optim.lr = 3e-3
    cfg.schedule = dataclasses.replace(cfg.schedule, lr="constant", warmup_steps=0, mtp_weight=[[0, 0.0]],
                                       balance_rate=[[0, 0.0]], aux_loss_weight=0.0)  # fmt: skip
    cfg.ckpt.every, cfg.ckpt.keep_last, cfg.log.progress = 0, 2, False
    return cfg
