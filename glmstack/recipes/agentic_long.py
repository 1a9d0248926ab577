"""Long-horizon agentic RL with context management (issue 40): the `search` environment at level 1 (follow 4-5 notes
to a secret code word), whose episodes run past the speedrun model's 512 positions unless older notes are folded.
The call budget is 3: below the chain's length, so an episode succeeds only if the agent takes the notes' shortcuts
("Ben will send you to Cleo": read Cleo next), which the SFT teacher takes 30% of the time (synthetic.SEARCH_SKIP_P)
— RL has to learn to take them. Without management every episode runs out of the 512 positions (the trained
policy's too: docs/agentic.md, session 15).

GLM-5's search agent keeps the k = 5 most recent tool outputs (research/wave3-facts.md §6); at this scale a tool turn
is ~90 tokens and the prompt ~250, so k = 1: every note but the latest is replaced by "[tool output elided]"
(posttrain/agentic/context.py). A trajectory whose context was folded trains each turn on the context it was
sampled from (segments, posttrain/sample.py). `sft()` first teaches the speedrun SFT model the environment (the
opt-in `search` SFT set: one turn in the context the agent sees then, with and without folding), since it has never
seen the `read_note` tool.

    glmstack sft agentic_long --set init_from=/work/runs/sr5/sft/model --set run=long     # -> runs/long/sft_search/model
    glmstack agentic-rl agentic_long --set init_from=runs/long/sft_search/model --set seed=S --set run=long_sS
    glmstack agentic-rl agentic_long --set init_from=... --set agentic.episode.context.keep_last_tool_results=0  # off
    python -m glmstack.posttrain.agentic.probe MODEL --env search --level 1 --max-turns 4 --max-calls 3 --keep-last 1  # start
"""

from __future__ import annotations

import dataclasses

from glmstack.posttrain.agentic.context import ContextOptions
from glmstack.posttrain.agentic.stage import AgenticConfig
from glmstack.posttrain.sft import SFTConfig
from glmstack.recipes import agentic_speedrun, sft_speedrun

SFT_STEPS = 300
KEEP_LAST = 1
CALL_BUDGET = 3  # reading every note takes 4-5 calls; skipping where the notes allow, 3


def sft() -> SFTConfig:
    cfg = sft_speedrun.expert("search", ("search",), SFT_STEPS)
    cfg.run, cfg.stage, cfg.init_from = "long", "sft_search", "speedrun/sft/model"
    cfg.micro_batch_size = 8
    cfg.optim.lr = 1e-3
    cfg.schedule = dataclasses.replace(cfg.schedule, warmup_steps=5)
    cfg.sft = dataclasses.replace(cfg.sft, synthetic_n=2000)
    cfg.ckpt.every = 0
    return cfg


def agentic() -> AgenticConfig:
    cfg = agentic_speedrun.agentic()
    cfg.run, cfg.init_from, cfg.steps, cfg.grad_accum = "long", "long/sft_search/model", 40, 4
    o = cfg.agentic
    o.envs, o.level, o.groups_per_step = [["search", 1.0]], 1, 8  # 64 trajectories per step
    o.dynamic_sampling = True  # train on groups whose episodes disagree (most groups at the start are all-fail)
    o.heldout_n, o.heldout_seed, o.eval_every = 64, 0, 5
    o.episode.max_turns, o.episode.max_new_tokens = CALL_BUDGET + 1, 32  # the calls + the answer
    o.episode.context = ContextOptions(keep_last_tool_results=KEEP_LAST)
    o.env.max_tool_calls, o.env.free_calls = CALL_BUDGET, CALL_BUDGET  # the budget ends the episode; no penalty
    o.reset_optimizer = False  # as agentic_tools: Muon's momentum kept across pushes
    cfg.optim.lr = 2e-4  # 5e-4 moved held-out success up and down (docs/agentic.md, session 15)
    return cfg
