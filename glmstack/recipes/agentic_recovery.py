"""Robustness to tool failures (docs/agentic.md, session 6): a short SFT continuation that makes a retry after a
failed tool call reachable, then agentic RL on the `calculator` environment trained with or without injected
failures, both scored greedy on the same 128 held-out tasks without and with failures (`eval_fault_p=0.5`).

The speedrun's SFT models never retry a failed call (log-prob of repeating it −30, docs/agentic.md session 5), so
RL with fault injection has nothing to reinforce. `sft()` continues the SFT model on the tools set plus the opt-in
`tools_recovery` set (a failed call — the environment's own failure texts — then the same call again, then the
answer) for a few steps, so that the model sometimes retries; RL with failures can then make the retry a habit.

    glmstack sft agentic_recovery --set init_from=runs/r20/sft/model --set run=rec          # -> runs/rec/sft_recovery/model
    glmstack agentic-rl agentic_recovery --set init_from=runs/rec/sft_recovery/model --set seed=S --set run=clean_sS
    glmstack agentic-rl agentic_recovery --set init_from=... --set agentic.env.fault_p=0.5 --set seed=S --set run=faults_sS
"""

from __future__ import annotations

import dataclasses

from glmstack.posttrain.agentic.stage import AgenticConfig
from glmstack.posttrain.sft import SFTConfig
from glmstack.recipes import agentic_calc, sft_speedrun

# measured (docs/agentic.md, session 6): after 1 step the model retries 11% of failed calls (T = 1), after 2 steps
# 76%, after 5 steps 94% — but a retry is often a miscopied call (another expression, or the python tool), so
# success with failures rises only 0.43 -> 0.47: what a retry contains is left for RL to reinforce.
SFT_STEPS = 5


def sft() -> SFTConfig:
    cfg = sft_speedrun.expert("recovery", ("tools", "tools_recovery"), SFT_STEPS)
    cfg.run, cfg.stage, cfg.init_from = "recovery", "sft_recovery", "speedrun/sft/model"
    cfg.micro_batch_size = 8
    cfg.optim.lr = 5e-4  # a sixth of the 20-minute speedrun SFT's peak: a nudge, not a new skill
    cfg.schedule = dataclasses.replace(cfg.schedule, warmup_steps=1)
    cfg.ckpt.every = 0
    return cfg


def agentic() -> AgenticConfig:
    cfg = agentic_calc.agentic()
    cfg.run, cfg.init_from = "recovery", "recovery/sft_recovery/model"
    cfg.agentic.level = 0  # the SFT set's expressions: solved ~95% clean, so the failures decide
    return cfg
