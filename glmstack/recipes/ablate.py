"""The ablate recipe: the micro GLM-4.5 every claim of `glmstack ablate` starts from (glmstack/ablate/claims/).

The GLM-4.5 shape at the smallest size where its parts still act: one dense layer then one MoE layer (8 routed
experts, top-2, one shared expert, sigmoid router with the loss-free bias), QK-Norm, partial RoPE, one MTP layer,
Muon + AdamW with a warm-up + cosine lr; synthetic Markov-chain data (glmstack/train/markov_stream.py, branching 4,
so ln 4 = 1.386 is the floor of the loss). A step takes ~0.1 s on one quiet CPU core, so a claim with three arms
and three seeds runs in minutes. Claims change it only through overrides; `ablate_gpu` is the larger version.

    glmstack pretrain ablate                          # the base arm alone
    glmstack ablate muon --seeds 3                    # a claim: arms = this recipe + overrides
"""

from __future__ import annotations

import dataclasses

from glmstack.train.config import TrainConfig

STEPS = 200
MICRO = {"vocab_size": 128, "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32,
         "num_hidden_layers": 2, "first_k_dense_replace": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 16, "n_routed_experts": 8, "num_experts_per_tok": 2}


def pretrain() -> TrainConfig:
    cfg = TrainConfig(run="ablate", stage="pretrain", model="tiny", model_overrides=dict(MICRO), seq_len=32,
                      micro_batch_size=8, steps=STEPS)
    cfg.optim.lr = 3e-3  # the tiny recipe's toy-scale peak
    cfg.schedule = dataclasses.replace(cfg.schedule, warmup_steps=STEPS // 10, total_steps=STEPS,
                                       mtp_weight=[[0, 0.3]], balance_rate=[[0, 1e-3]])
    cfg.ckpt.every, cfg.log.val_every, cfg.log.val_batches = 0, STEPS, 8
    return cfg
