"""Reasoning RL on the speedrun's SFT model: GRPO + IcePop (GLM-5 Eq. 1) on procedural arithmetic.

`init_from` is the SFT stage's model folder (`glmstack sft sft_speedrun` writes runs/speedrun/sft/model); point it at
another chat model with --set init_from=FOLDER. Sizes fit ~10 minutes per seed on the shared 2-core machine
(docs/rl.md has the measured figures and the command).

    glmstack rl rl_speedrun
    glmstack rl rl_speedrun --set init_from=/path/to/sft/model --set seed=1 --set run=rl_seed1
"""

from __future__ import annotations

import dataclasses

from glmstack.posttrain.rl.stage import RLConfig, RLOptions


def rl() -> RLConfig:
    cfg = RLConfig(run="speedrun", stage="rl", init_from="speedrun/sft/model", seq_len=128, micro_batch_size=16,
                   grad_accum=2, steps=40,
                   rl=RLOptions(task="arithmetic", samples_per_step=32, curriculum=[[0, 0, 8]], max_new_tokens=16,
                                heldout_n=100, eval_every=10))  # fmt: skip
    cfg.optim.lr = 3e-4
    cfg.schedule = dataclasses.replace(cfg.schedule, lr="constant", warmup_steps=0, mtp_weight=[[0, 0.0]],
                                       balance_rate=[[0, 0.0]], aux_loss_weight=0.0)  # fmt: skip
    cfg.ckpt.every, cfg.ckpt.keep_last = 20, 2
    return cfg
