"""The tiny recipe: a 3-layer GLM-4.5-shaped MoE (8 experts, top-2, 1 MTP layer) on synthetic data, on a CPU in
about a minute per stage. The GLM-4.5 shape of the curriculum at toy scale: warm-up + cosine over both stages
to 10%, MTP weight 0.3 then 0.1, balancing rate 1e-3 then 0, mid-training at twice the context with RoPE base
1e4 -> 1e6. Synthetic data has no documents, so mid-training concatenates as pre-training does; best-fit packing
of real documents is in the speedrun recipe (token shards).

    glmstack pretrain tiny && glmstack midtrain tiny
    glmstack data tiny --out runs/data-tiny          # the tiny data build (~0.2 MB corpus)
"""

from __future__ import annotations

import dataclasses

from glmstack.data.corpus import CorpusConfig
from glmstack.data.pipeline import PipelineConfig
from glmstack.train.config import TrainConfig

PRETRAIN_STEPS = 200
MIDTRAIN_STEPS = 50


def pretrain() -> TrainConfig:
    cfg = TrainConfig(
        run="tiny",
        stage="pretrain",
        model="tiny",
        seq_len=64,
        micro_batch_size=8,
        grad_accum=1,
        steps=PRETRAIN_STEPS,
        rope_theta=1e4,
    )
    cfg.optim.lr = 3e-3  # toy scale tolerates a larger lr than GLM-4.5's 2.5e-4
    cfg.schedule = dataclasses.replace(
        cfg.schedule,
        warmup_steps=20,
        total_steps=PRETRAIN_STEPS + MIDTRAIN_STEPS,
        mtp_weight=[[0, 0.3], [150, 0.1]],
        balance_rate=[[0, 1e-3]],
        batch_warmup_start_tokens=256,
        batch_warmup_tokens=20 * 8 * 64,  # the first 20 full steps' worth of tokens
    )
    cfg.ckpt.every, cfg.log.val_every = 50, 50
    return cfg


def midtrain() -> TrainConfig:
    cfg = pretrain()
    cfg.stage, cfg.steps, cfg.init_from = "midtrain", MIDTRAIN_STEPS, "tiny/pretrain"
    cfg.seq_len, cfg.micro_batch_size, cfg.rope_theta = 128, 4, 1e6  # GLM-4.5: 4K/1e4 -> 32K/1e6
    cfg.schedule = dataclasses.replace(  # the same lr curve (warm-up kept: it sets the cosine's phase)
        cfg.schedule,
        step_offset=PRETRAIN_STEPS,
        rewarmup_steps=10,  # only if the optimizer state is not carried over
        mtp_weight=[[0, 0.1]],
        balance_rate=[[0, 0.0]],
        batch_warmup_start_tokens=0,
        batch_warmup_tokens=0,
    )
    cfg.ckpt.every, cfg.log.val_every = 25, 25
    return cfg


def data() -> PipelineConfig:
    """A ~0.2 MB corpus for tests and smoke runs (`glmstack data tiny`); the train stages above use synthetic data."""
    return PipelineConfig(corpus=CorpusConfig(size_mb=0.2), unit_docs=64)
