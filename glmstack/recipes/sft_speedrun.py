"""SFT recipes on the speedrun model (`glmstack speedrun` writes runs/speedrun/model): the overall hybrid-reasoning
SFT on every synthetic set, and the three experts of GLM-4.5's expert iteration (reasoning, tool use, chat).

    glmstack sft sft_speedrun                    # runs/speedrun/sft/model
    glmstack expert-iteration sft_speedrun       # from runs/speedrun/sft/model: experts -> rejection sampling ->
                                                 # merged SFT -> table

Sizes were measured on the shared 2-core machine (docs/sft.md): 512-token rows hold a tool conversation (~440
tokens with the tools block) or several short ones.
"""

from __future__ import annotations

import dataclasses

from glmstack.posttrain.sft import SFTConfig, SFTOptions

SETS = ("arithmetic", "tools", "chat", "compare")
STEPS = 300
# the experts of `glmstack expert-iteration` (not used by `glmstack sft sft_speedrun` / the speedrun): expert ->
# (its set, its steps). The reasoning expert's set is `compare`: on `arithmetic` a model of this size scores 0
# held-out (docs/sft.md), so there was nothing to keep. Tool use is the hard skill (its score still rises at 40,
# 120 and 240 steps: 36%, 52%, 68%); compare and chat are learnt by the cold-start model already.
EXPERTS = {"reasoning": ("compare", 40), "tools": ("tools", 240), "chat": ("chat", 40)}
EXPERT_SETS = tuple(s for s, _ in EXPERTS.values())
MERGED_STEPS = sum(n for _, n in EXPERTS.values())  # the overall SFT: every expert's budget, in one run


def sft() -> SFTConfig:
    cfg = SFTConfig(
        run="speedrun",
        stage="sft",
        init_from="speedrun/model",
        seq_len=512,
        model_overrides={"max_position_embeddings": 512},  # the speedrun's model was trained to 256
        micro_batch_size=8,
        steps=STEPS,
        sft=SFTOptions(data=[f"synthetic:{s}" for s in SETS], val_data=[f"synthetic:{s}" for s in SETS]),
    )
    cfg.optim.lr = 1e-3
    cfg.schedule = dataclasses.replace(
        cfg.schedule, warmup_steps=20, mtp_weight=[[0, 0.1]], balance_rate=[[0, 1e-3]], aux_loss_weight=0.0
    )
    cfg.ckpt.every, cfg.ckpt.keep_last, cfg.log.every, cfg.log.val_every, cfg.log.val_batches = 100, 2, 10, 100, 2
    return cfg


def expert(name: str, sets: tuple[str, ...], steps: int) -> SFTConfig:
    """Experts and the merged model start from one base: the cold-start model of `sft()` (GLM-4.5's experts are
    cold-start SFT + their own training; at this size 40 steps from the pre-trained model do not teach the format)."""
    cfg = sft()
    cfg.stage, cfg.steps, cfg.micro_batch_size = f"expert_{name}", steps, 4
    cfg.init_from, cfg.model_overrides = "speedrun/sft/model", {}
    cfg.schedule = dataclasses.replace(cfg.schedule, warmup_steps=5)
    cfg.sft = dataclasses.replace(cfg.sft, data=[f"synthetic:{s}" for s in sets], val_data=[])
    cfg.log.val_every = 0
    return cfg


# the experts (GLM-4.5 §3.1: reasoning, agent, general chat) and the merged model trained on their samples
def _expert(name: str) -> SFTConfig:
    set_name, steps = EXPERTS[name]
    return expert(name, (set_name,), steps)


def sft_reasoning() -> SFTConfig:
    return _expert("reasoning")


def sft_tools() -> SFTConfig:
    return _expert("tools")


def sft_chat() -> SFTConfig:
    return _expert("chat")


def sft_merged() -> SFTConfig:
    """GLM-4.5's overall SFT: the experts' training sets plus their rejection-sampled outputs (the driver appends
    those files, `--rs-weight` times each), for the experts' steps together at their lr, so every skill gets the
    budget its expert had. A tool conversation (~400 tokens) fills a 512-token row and the short compare and chat
    conversations pack into the rest, so the merged model sees about as many tool conversations per step as the
    tool expert (docs/sft.md: the sampled outputs alone kept 36% of the tool expert's score)."""
    return expert("merged", EXPERT_SETS, MERGED_STEPS)
