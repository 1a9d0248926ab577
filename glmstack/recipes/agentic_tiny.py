"""Agentic RL smoke test: a tiny chat model folder (init_from; tests make one with a random GLM and a small BPE
tokenizer), short episodes, two steps. The tests and `bench/agentic_async.py` start from it.

    glmstack agentic-rl agentic_tiny --set init_from=FOLDER --set steps=2
"""

from __future__ import annotations

import dataclasses

from glmstack.posttrain.agentic.episode import EpisodeOptions
from glmstack.posttrain.agentic.stage import AgenticConfig, AgenticOptions


def agentic() -> AgenticConfig:
    cfg = AgenticConfig(run="tiny", stage="agentic", init_from="", seq_len=256, micro_batch_size=4, grad_accum=2,
                        steps=2,
                        agentic=AgenticOptions(group_size=4, groups_per_step=2, workers=1, tau=1, heldout_n=0,
                                               episode=EpisodeOptions(max_turns=2, max_new_tokens=8)))  # fmt: skip
    cfg.optim.lr = 1e-3
    cfg.schedule = dataclasses.replace(cfg.schedule, lr="constant", warmup_steps=0, mtp_weight=[[0, 0.0]],
                                       balance_rate=[[0, 0.0]], aux_loss_weight=0.0)  # fmt: skip
    cfg.ckpt.every, cfg.ckpt.keep_last, cfg.log.progress, cfg.log.plots = 0, 1, False, False
    return cfg
