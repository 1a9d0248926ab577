"""Agentic RL on the speedrun's SFT model: the calculator and python tool environments (the SFT tool set's tasks,
~20% held-out success at the start, docs/sft.md), GLM-5's asynchronous recipe (DIS loss, reward − group mean,
weights pushed every update with an optimizer reset, staleness bound 1).

    glmstack agentic-rl agentic_speedrun --set init_from=/path/to/sft/model
    glmstack agentic-rl agentic_speedrun --set runner=ray --set ray.num_cpus=2
    glmstack agentic-rl agentic_speedrun --set agentic.env.fault_p=0.3 --set run=faults   # robustness training
"""

from __future__ import annotations

import dataclasses

from glmstack.posttrain.agentic.episode import EpisodeOptions
from glmstack.posttrain.agentic.stage import AgenticConfig, AgenticOptions


def agentic() -> AgenticConfig:
    cfg = AgenticConfig(run="speedrun", stage="agentic", init_from="speedrun/sft/model", seq_len=512,
                        micro_batch_size=8, grad_accum=2, steps=30,
                        agentic=AgenticOptions(group_size=8, groups_per_step=2, workers=1, tau=1,
                                               episode=EpisodeOptions(max_turns=3, max_new_tokens=40),
                                               heldout_n=40, eval_every=10))  # fmt: skip
    cfg.optim.lr = 1e-3
    cfg.schedule = dataclasses.replace(cfg.schedule, lr="constant", warmup_steps=0, mtp_weight=[[0, 0.0]],
                                       balance_rate=[[0, 0.0]], aux_loss_weight=0.0)  # fmt: skip
    cfg.ckpt.every, cfg.ckpt.keep_last = 0, 1
    return cfg
