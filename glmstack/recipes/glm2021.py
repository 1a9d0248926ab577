"""The glm2021 recipe: GLM's autoregressive blank infilling (arXiv 2103.10360) on the tiny model and synthetic
data, through the one training loop. The tiny GLM-4.5-shaped model with the paper's 2D positions
(`position_2d`, as 2D RoPE over the full head) and no MTP; every row is one document corrupted by the multi-task
mix of the paper's §2.3 (half blank infilling [MASK], half generation objectives: [sMASK] sentences and [gMASK]
tail spans). Sentences of the synthetic stream end at ids below 32 (~1 token in 15).

    glmstack pretrain glm2021                              # ~1-2 min on a CPU
    glmstack pretrain glm2021 --set 'data.options={"reserved_ids": 5, "blank_infilling": {"weights": {"mask": 1}}}'

GLM-130B's stabilisers are model options any recipe can set: `--set model_overrides.deepnorm=true`,
`--set model_overrides.embedding_grad_shrink=0.1` (docs/model.md, "GLM-family options").
"""

from __future__ import annotations

import dataclasses

from glmstack.recipes import tiny
from glmstack.train.config import TrainConfig

STEPS = 200
SENTENCE_END_IDS = list(range(32))


def blank_options(weights: dict[str, float] | None = None, seed: int = 0) -> dict:
    """data.options for the blank-infilling transform over SyntheticLM (its top 5 ids kept for the specials)."""
    weights = weights or {"mask": 0.5, "smask": 0.25, "gmask": 0.25}
    return {"reserved_ids": 5, "blank_infilling": {"weights": weights, "sentence_end_ids": SENTENCE_END_IDS,
                                                   "seed": seed}}


def pretrain() -> TrainConfig:
    cfg = tiny.pretrain()
    cfg.run, cfg.steps = "glm2021", STEPS
    cfg.model_overrides = {"num_nextn_predict_layers": 0, "position_2d": True, "partial_rotary_factor": 1.0}
    cfg.data = dataclasses.replace(cfg.data, options=blank_options())
    cfg.schedule = dataclasses.replace(cfg.schedule, total_steps=STEPS, mtp_weight=[[0, 0.0]])
    return cfg
