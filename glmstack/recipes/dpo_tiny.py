"""DPO on a random tiny GLM with the synthetic checkable preference set: the smoke test of `glmstack dpo` and its
tests. The tiny preset has no tokenizer of its own: give a model folder (init_from) or a tokenizer folder.

    glmstack dpo dpo_tiny --set init_from=FOLDER --set steps=4
    glmstack dpo dpo_tiny --set dpo.tokenizer=FOLDER --set dpo.loss_type=ipo
"""

from __future__ import annotations

import dataclasses

from glmstack.posttrain.dpo.stage import DPOConfig, DPOOptions


def dpo() -> DPOConfig:
    cfg = DPOConfig(run="tiny", stage="dpo", model="tiny", seq_len=64, micro_batch_size=8, grad_accum=1, steps=10,
                    dpo=DPOOptions(synthetic_n=200, beta=0.1))  # fmt: skip
    cfg.optim.lr = 3e-3
    cfg.schedule = dataclasses.replace(
        cfg.schedule, lr="constant", warmup_steps=0, mtp_weight=[[0, 0.0]], aux_loss_weight=0.0
    )  # the loss is DPO's alone
    cfg.ckpt.every, cfg.ckpt.keep_last, cfg.log.progress, cfg.log.plots = 0, 2, False, False
    return cfg
