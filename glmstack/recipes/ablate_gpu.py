"""The larger version of `glmstack ablate`'s base recipe, for one GPU (written, unverified: no GPU has run it).

The ablate recipe's GLM-4.5 shape 4x wider, 4 layers deep, 16 experts top-4, at 4x the context and 8x the batch
(32K tokens per step), bf16 autocast and compiled blocks on CUDA (the loop's defaults there). Claims whose arms fix
their own sizes (depth_heads' widths, dsa_warmup's GLM-5 model, icepop's RL model) keep them; the others run on
this base. Steps come from --scale or --budget-minutes as on a CPU.

    glmstack ablate --recipe ablate_gpu --seeds 5 --scale 10 --out runs/ablate_gpu
"""

from __future__ import annotations

from glmstack.recipes import ablate
from glmstack.train.config import TrainConfig

WIDE = {"vocab_size": 1024, "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 128,
        "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 32,
        "n_routed_experts": 16, "num_experts_per_tok": 4}


def pretrain() -> TrainConfig:
    cfg = ablate.pretrain()
    cfg.run, cfg.seq_len, cfg.micro_batch_size, cfg.device = "ablate_gpu", 128, 64, "auto"
    cfg.model_overrides = ablate.MICRO | WIDE
    cfg.optim.lr = 2e-3
    return cfg
