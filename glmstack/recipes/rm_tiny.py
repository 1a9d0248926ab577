"""A Bradley–Terry reward model on a random tiny GLM: the smoke test of `glmstack rm` and its tests.

The tiny preset has no tokenizer of its own: give one (any folder with tokenizer.json whose ids fit vocab 512).

    glmstack rm rm_tiny --set rm.tokenizer=FOLDER --set steps=4
"""

from __future__ import annotations

import dataclasses

from glmstack.posttrain.rm.stage import RMConfig, RMOptions


def rm() -> RMConfig:
    cfg = RMConfig(run="tiny", stage="rm", model="tiny", model_overrides={"num_nextn_predict_layers": 0}, seq_len=64,
                   micro_batch_size=8, grad_accum=1, steps=10, rm=RMOptions(synthetic_n=200))  # fmt: skip
    cfg.optim.lr = 3e-3
    cfg.schedule = dataclasses.replace(cfg.schedule, lr="constant", warmup_steps=0, mtp_weight=[[0, 0.0]])
    cfg.ckpt.every, cfg.ckpt.keep_last, cfg.log.progress, cfg.log.plots = 0, 2, False, False
    return cfg
