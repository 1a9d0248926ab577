"""GLM-5's final stage at speedrun scale: on-policy cross-stage distillation from the earlier stages' models.

The student (`init_from`) is the last stage's model; each teacher brings its own stage's prompts (`task`), one sample
per prompt, Eq. 2's per-token advantage inside GRPO + IcePop. The defaults: the SFT model teaches tool calls and
chat; give the real stage folders with --set (docs/rl.md has the measured run and its command).

    glmstack distill distill_speedrun --set init_from=runs/x/later/model \\
        --set 'distill.teachers=[{"model": "runs/x/sft/model", "task": "tools"}, {"model": "runs/y/model", "task": "chat"}]'
"""

from __future__ import annotations

import dataclasses

from glmstack.posttrain.rl.distill import DistillConfig, DistillOptions, distill_rl_options


def distill() -> DistillConfig:
    teachers = [{"model": "speedrun/sft/model", "task": "tools"}, {"model": "speedrun/sft/model", "task": "chat"}]
    cfg = DistillConfig(run="speedrun", stage="distill", init_from="speedrun/sft/model", seq_len=512,
                        micro_batch_size=16, grad_accum=1, steps=30, distill=DistillOptions(teachers=teachers),
                        rl=distill_rl_options(task="tools", samples_per_step=16, max_new_tokens=48,
                                     heldout_n=32, eval_every=10))  # fmt: skip
    cfg.optim.lr = 3e-4
    cfg.schedule = dataclasses.replace(cfg.schedule, lr="constant", warmup_steps=0, mtp_weight=[[0, 0.0]],
                                       balance_rate=[[0, 0.0]], aux_loss_weight=0.0)  # fmt: skip
    cfg.ckpt.every, cfg.ckpt.keep_last = 10, 2
    return cfg
