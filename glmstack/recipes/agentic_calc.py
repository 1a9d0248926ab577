"""Agentic RL on the `calculator` environment at level 1 (the SFT set's expressions with a three-digit first
operand: 128 held-out tasks, all distinct): the setting where agentic RL raised held-out success in
docs/agentic.md's session 6.

The 20-minute speedrun's SFT model (hidden 128, `glmstack speedrun --minutes 20`) solves about 1 in 5 of them
greedy: it calls the calculator every time but copies a three-digit operand as two digits ("64 * 44" for
"643 * 44"), or miscopies the five-digit result. Both are choices RL can reinforce: sampled at T = 1 it copies
the expression right in ~20% of episodes. 10 steps of 64 trajectories (8 groups × 8), Muon lr 1e-3 with the
momentum kept across pushes (agentic_tools). Measured (3 fresh seeds): held-out 0.180 -> 0.375 ± 0.078, every seed
above the start; run on to 30 steps (`--set steps=30`) the gain was lost in some seeds (0.461, 0.367, 0.109).

    glmstack agentic-rl agentic_calc --set init_from=runs/r20/sft/model --set seed=S --set run=calc_sS
"""

from __future__ import annotations

from glmstack.posttrain.agentic.stage import AgenticConfig
from glmstack.recipes import agentic_tools


def agentic() -> AgenticConfig:
    cfg = agentic_tools.agentic()
    cfg.run, cfg.steps, cfg.grad_accum = "calc", 10, 8
    o = cfg.agentic
    o.envs, o.level, o.groups_per_step, o.eval_every = [["calculator", 1.0]], 1, 8, 10  # 64 trajectories per step
    cfg.optim.lr = 1e-3
    return cfg
