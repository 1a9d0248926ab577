"""Reasoning RL on the speedrun's SFT model: GRPO + IcePop (GLM-5 Eq. 1) on the procedural `compare` task.

The task ("Which is the largest of 3, 8 and 5?", or the smallest; level 3 of glmstack.posttrain.synthetic's compare
set) is one the 5-minute speedrun's SFT model partly solves — about 1 in 4 held-out problems greedy, inside issue
17's 10-60% band — so RL has room to raise it (docs/rl.md: the 3-seed table and the command). `init_from` is the
SFT stage's model folder (`glmstack sft sft_speedrun` writes runs/speedrun/sft/model); point it at another chat
model with --set init_from=FOLDER. 60 steps of 64 rollouts fit ~10 minutes per seed on the shared 2-core machine.

    glmstack rl rl_speedrun
    glmstack rl rl_speedrun --set init_from=/path/to/sft/model --set seed=1 --set run=rl_seed1
"""

from __future__ import annotations

import dataclasses

from glmstack.posttrain.rl.stage import RLConfig, RLOptions

LEVEL = 3  # the largest or the smallest of three one-digit numbers


def rl() -> RLConfig:
    cfg = RLConfig(run="speedrun", stage="rl", init_from="speedrun/sft/model", seq_len=128, micro_batch_size=32,
                   grad_accum=2, steps=60,
                   rl=RLOptions(task="compare", samples_per_step=64, curriculum=[[0, LEVEL, 8]], max_new_tokens=12,
                                heldout_n=200, heldout_level=LEVEL, eval_every=10))  # fmt: skip
    cfg.optim.lr = 1e-3  # measured: 3e-3 collapses to all-equal groups (zero gradient) within 40 steps
    cfg.schedule = dataclasses.replace(cfg.schedule, lr="constant", warmup_steps=0, mtp_weight=[[0, 0.0]],
                                       balance_rate=[[0, 0.0]], aux_loss_weight=0.0)  # fmt: skip
    cfg.ckpt.every, cfg.ckpt.keep_last = 20, 2
    return cfg
