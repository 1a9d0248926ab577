"""GLM-5's route to DSA sparse attention at toy scale (arXiv 2602.15763 §2.1.1; DeepSeek-V3.2 §2.1.1):
a dense MLA model, then the indexer's two training stages, then RL's frozen
indexer. Every stage is the same loop (glmstack/train/loop.py); they differ only by `model_overrides.dsa_stage`
(glmstack/model/dsa.py `apply_dsa_stage`), the checkpoint they start from and their schedule:

  pretrain()  dense MLA, indexer unused (GLM-5 starts DSA from its dense mid-training checkpoint)
  midtrain()  dense warm-up: attention stays dense and ONLY the indexers train, on KL(main attention summed over
              heads and L1-normalised ‖ softmax(index scores)). GLM-5: 1000 steps, lr 5e-3 decaying to 2e-4.
  sparse()    sparse adaptation: top-k selection on and everything trains; the indexer on the KL restricted to its
              selected keys, with its input detached. GLM-5: mid-training data, constant lr 1e-5, 20B tokens.
              Run by the `glm5_dsa_sparse` recipe (one `midtrain` stage per recipe module).
  rl_overrides  what GLM-5's RL does with the indexer: frozen (no KL, no gradient), deterministic torch.topk.

    glmstack pretrain glm5_dsa && glmstack midtrain glm5_dsa && glmstack midtrain glm5_dsa_sparse
    python bench/dsa_warmup.py            # indexer top-k recall before / after the warm-up
"""

from __future__ import annotations

import dataclasses

from glmstack.train.config import TrainConfig

PRETRAIN_STEPS, WARMUP_STEPS, SPARSE_STEPS = 200, 60, 40
TOPK = 16  # keys per query under DSA at seq_len 128 (GLM-5: 2048 of up to 202752)
RL_OVERRIDES = {"dsa_stage": "frozen"}  # GLM-5 RL: indexer frozen (torch.topk is the default selection)


def pretrain() -> TrainConfig:
    cfg = TrainConfig(run="glm5_dsa", stage="pretrain", model="tiny-glm5", seq_len=128, micro_batch_size=8,
                      steps=PRETRAIN_STEPS, model_overrides={"dsa_stage": "dense", "index_topk": TOPK})
    cfg.optim.lr = 3e-3  # toy scale
    cfg.schedule = dataclasses.replace(cfg.schedule, warmup_steps=20, mtp_weight=[[0, 0.3]])
    cfg.ckpt.every = 0
    return cfg


def midtrain() -> TrainConfig:
    """Dense warm-up of the indexers (everything else frozen, so no balancing either)."""
    cfg = pretrain()
    cfg.stage, cfg.steps, cfg.init_from = "dsa_warmup", WARMUP_STEPS, "glm5_dsa/pretrain"
    cfg.model_overrides = {"dsa_stage": "warmup"}
    cfg.optim.lr = 5e-3  # GLM-5's warm-up peak, decaying to 2e-4
    cfg.schedule = dataclasses.replace(cfg.schedule, warmup_steps=0, final_lr_frac=2e-4 / 5e-3,
                                       balance_rate=[[0, 0.0]], mtp_weight=[[0, 0.3]])
    return cfg


def sparse() -> TrainConfig:
    """Sparse adaptation: selection on, all parameters train at a small constant lr."""
    cfg = pretrain()
    cfg.stage, cfg.steps, cfg.init_from = "dsa_sparse", SPARSE_STEPS, "glm5_dsa/dsa_warmup"
    cfg.model_overrides = {"dsa_stage": "sparse"}
    cfg.optim.lr = 3e-4  # GLM-5: constant 1e-5 at full scale; toy scale keeps the same 1/10 of pre-training
    # balancing as in GLM-4.5's mid-training (bias rate 0 after the first 15T tokens): the sparse stage runs on
    # mid-training data after all of pre-training, so the pre-training rate 1e-3 would not be GLM's schedule
    # the warm-up trained only the indexers, so the optimizer state cannot carry over: re-warm up the lr
    cfg.schedule = dataclasses.replace(cfg.schedule, lr="constant", warmup_steps=0, rewarmup_steps=4,
                                       mtp_weight=[[0, 0.1]], balance_rate=[[0, 0.0]])
    return cfg
