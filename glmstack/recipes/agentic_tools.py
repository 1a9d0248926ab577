"""Agentic RL on the 15-minute speedrun's SFT model, `python` tool environment at level 1 (the SFT set's programs
over wider ranges): the setting of docs/agentic.md's session-5 measurements (clean and fault-injected training,
scored with and without injected failures; held-out success did not rise there).

The 15-minute SFT model calls the python tool correctly on almost every task and gets about 1 in 3 level-1
held-out tasks right (greedy), so most groups of 8 have differing rewards. 128 held-out tasks, the same for every
seed (`heldout_seed=0`), scored greedy without and with injected tool failures (`eval_fault_p=0.5`) at the end.

    glmstack agentic-rl agentic_tools --set init_from=runs/sr15/sft/model --set seed=S --set run=tools_sS
    glmstack agentic-rl agentic_tools --set init_from=... --set agentic.env.fault_p=0.5 --set run=tools_faults_sS
"""

from __future__ import annotations

from glmstack.posttrain.agentic.stage import AgenticConfig
from glmstack.recipes import agentic_speedrun


def agentic() -> AgenticConfig:
    cfg = agentic_speedrun.agentic()
    cfg.run, cfg.steps, cfg.grad_accum = "tools", 15, 4
    o = cfg.agentic
    o.envs, o.level, o.groups_per_step = [["python", 1.0]], 1, 4  # 32 trajectories per step
    o.heldout_n, o.heldout_seed, o.eval_every = 128, 0, 0
    # Muon's step has a fixed size, and with the state reset after every push (K = 1) it is the orthogonalised
    # gradient of one 32-trajectory batch: measured, lr 1e-3 with the reset drops held-out success 0.35 -> 0.16 in
    # 15 steps. Keeping the momentum across pushes averages the batches, as the reasoning RL recipe does.
    o.reset_optimizer = False
    cfg.optim.lr = 5e-4
    return cfg
