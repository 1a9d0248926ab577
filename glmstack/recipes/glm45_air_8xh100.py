"""GLM-4.5-Air (106B total / 12B active; 109B / 13.7B counting the MTP layer) with GLM-4.5's pre- and
mid-training numbers (arXiv 2508.06471 §2.4; Muon settings: Moonlight, arXiv 2502.16982), sized for nodes of
8 H100s: FSDP2 + expert parallel, bf16 autocast, Muon at 2.5e-4 cosine to 2.5e-5 over both stages.

    glmstack data my_sources.json --out runs/data --tokenizer /models/GLM-4.5-Air --workers 16
    torchrun --nproc_per_node 8 -m glmstack.cli pretrain glm45_air_8xh100
    torchrun --nproc_per_node 8 -m glmstack.cli midtrain glm45_air_8xh100   # from glm45_air/pretrain's latest
    glmstack pretrain glm45_air_8xh100 --print-config                       # the resolved config, no GPU needed

Several nodes: add `--nnodes N --node_rank i --rdzv-endpoint host:port` to torchrun (the batch is per rank, so
tokens per step grow with the world). Memory: `stage.build_model` builds on meta, shards, then fills each rank's
part from a stream of full tensors, so no rank holds the whole model; each keeps 1/W of the 109B parameters with
fp32 weights + grads + Muon momentum, ~12 bytes/parameter: ~164 GB on 8 ranks, ~82 GB on 16 (2 nodes of H200), ~41
GB on 32 (4 nodes of 80 GB H100). On one node, shrink the model: `--set model_overrides.num_hidden_layers=4`.

GLM-4.5 trains 23T tokens, switching MTP weight 0.3 -> 0.1 and the balancing bias rate 1e-3 -> 0 after 15T;
this recipe keeps those proportions over its own step budget.
"""

from __future__ import annotations

import dataclasses

from glmstack.train.config import TrainConfig

PRETRAIN_STEPS, MIDTRAIN_STEPS = 100_000, 10_000  # 512K tokens a step on 8 ranks: ~52B + ~5B tokens
SWITCH_STEP = PRETRAIN_STEPS * 15 // 23  # GLM-4.5: MTP 0.3 and bias rate 1e-3 for the first 15T of 23T tokens
TOKENS_PER_STEP = 1 * 4096 * 16  # per rank
BATCH_WARMUP_TOKENS = PRETRAIN_STEPS * TOKENS_PER_STEP * 500 // 23_000  # GLM-4.5: 16M -> 64M over the first 500B
WARMUP_STEPS = 2_000  # GLM-4.5 does not report its lr warm-up length; 2% of pre-training


def pretrain() -> TrainConfig:
    """4K context, RoPE base 1e4, concatenated documents; tokens per rank a step: 1 x 4096 x 16."""
    cfg = TrainConfig(
        run="glm45_air",
        stage="pretrain",
        model="glm-4.5-air",
        rope_theta=1e4,
        seq_len=4096,
        micro_batch_size=1,
        grad_accum=16,
        steps=PRETRAIN_STEPS,
        device="cuda",
        dtype="bfloat16",
    )
    cfg.optim = dataclasses.replace(cfg.optim, muon=True, lr=2.5e-4, weight_decay=0.1)
    cfg.schedule = dataclasses.replace(
        cfg.schedule,
        lr="cosine",
        warmup_steps=WARMUP_STEPS,
        total_steps=PRETRAIN_STEPS + MIDTRAIN_STEPS,  # the cosine reaches 2.5e-5 at the end of mid-training
        final_lr_frac=0.1,
        batch_warmup_start_tokens=TOKENS_PER_STEP // 4,  # a quarter of the full batch, as 16M of 64M
        batch_warmup_tokens=BATCH_WARMUP_TOKENS,
        mtp_weight=[[0, 0.3], [SWITCH_STEP, 0.1]],
        balance_rate=[[0, 1e-3], [SWITCH_STEP, 0.0]],
    )
    cfg.data = dataclasses.replace(
        cfg.data, kind="shards", path="runs/data/train", val_path="runs/data/eval", packing="concat"
    )
    cfg.dist = dataclasses.replace(cfg.dist, dp="fsdp", expert_parallel=True)
    cfg.ckpt.every, cfg.ckpt.keep_last = 1_000, 2
    cfg.log.every, cfg.log.val_every, cfg.log.progress = 10, 500, False  # torchrun logs: lines, not a bar
    return cfg


def midtrain() -> TrainConfig:
    """32K context with RoPE base 1e4 -> 1e6, best-fit packing, the cosine continued; same tokens a step."""
    cfg = pretrain()
    cfg.stage, cfg.steps, cfg.init_from = "midtrain", MIDTRAIN_STEPS, "glm45_air/pretrain"
    cfg.seq_len, cfg.grad_accum, cfg.rope_theta = 32_768, 2, 1e6
    cfg.data.packing = "best_fit"
    cfg.schedule = dataclasses.replace(  # the same lr curve (warm-up kept: it sets the cosine's phase)
        cfg.schedule,
        step_offset=PRETRAIN_STEPS,
        rewarmup_steps=WARMUP_STEPS // 4,  # only if the optimizer state is not carried over
        batch_warmup_start_tokens=0,
        batch_warmup_tokens=0,
        mtp_weight=[[0, 0.1]],
        balance_rate=[[0, 0.0]],
    )
    cfg.ckpt.every, cfg.log.val_every = 500, 250
    return cfg
