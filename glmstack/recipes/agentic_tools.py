"""Agentic RL on the 15-minute speedrun's SFT model, `python` tool environment: the setting where agentic RL raises
held-out success (docs/agentic.md, "Agentic RL that works": the 3-seed tables, with and without injected failures).

The 15-minute SFT model calls the python tool correctly and copies its output into "The result is X." on about
2 held-out tasks in 3 (greedy), so most groups of 8 have differing rewards; the earlier, weaker SFT model started at
6-15% and RL did not move it (docs/agentic.md). 128 held-out tasks, the same for every seed (`heldout_seed=0`),
scored greedy without and with injected tool failures (`eval_fault_p=0.5`).

    glmstack agentic-rl agentic_tools --set init_from=runs/sr15/sft/model --set seed=S --set run=tools_sS
    glmstack agentic-rl agentic_tools --set init_from=... --set agentic.env.fault_p=0.5 --set run=tools_faults_sS
"""

from __future__ import annotations

from glmstack.posttrain.agentic.stage import AgenticConfig
from glmstack.recipes import agentic_speedrun


def agentic() -> AgenticConfig:
    cfg = agentic_speedrun.agentic()
    cfg.run, cfg.steps, cfg.grad_accum = "tools", 25, 4
    o = cfg.agentic
    o.envs, o.level, o.groups_per_step = [["python", 1.0]], 1, 4  # 32 trajectories per step
    o.heldout_n, o.heldout_seed, o.eval_every = 128, 0, 0
    cfg.optim.lr = 1e-3
    return cfg
