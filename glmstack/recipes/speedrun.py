"""The speedrun's stage configs: `glmstack pretrain speedrun` / `glmstack midtrain speedrun`, and what the
`glmstack speedrun` job (glmstack/speedrun/) trains with. A budget in minutes picks a row of `SIZES`.

    cfg = pretrain(minutes=20, out="runs/speedrun", seed=0, vocab_size=2048)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, kw_only=True)
class Size:
    """One row of the budget table: what fits in `minutes` of a 2-core laptop CPU (shared machines run slower)."""

    minutes: float  # the smallest --minutes this row is used for
    hidden_size: int  # model width
    num_hidden_layers: int  # transformer blocks (the first is dense, the rest MoE)
    n_routed_experts: int  # routed experts per MoE layer (top-2 routed + 1 shared)
    vocab_size: int  # BPE vocabulary
    corpus_mb: float  # megabytes of the embedded corpus to run through the pipeline
    pretrain_steps: int  # optimizer steps of pre-training
    midtrain_steps: int  # optimizer steps of mid-training
    seq_len: int  # pre-training context
    mid_seq_len: int  # mid-training context (RoPE base raised with it)
    batch_size: int  # sequences per step
    sft_steps: int  # SFT steps on the synthetic sets (hybrid thinking, tool calls)
    sft_batch_size: int  # SFT rows per step
    sft_seq_len: int  # SFT rows (a tool conversation with its tools block is ~440 tokens)
    rl_steps: int  # reasoning-RL steps on the procedural compare task (0 = no RL stage)
    rl_level: int  # its level: 3 = the SFT set's hardest; 5 = two-digit numbers, unseen in SFT (for models that
    #   already solve level 3: RL needs a task the SFT model only partly solves)
    agentic_steps: int  # agentic-RL steps (calculator and python tools; distillation from the reasoning-RL model)
    agentic_groups: int  # groups of 8 episodes per agentic step
    general_steps: int  # general-RL steps (rules + distillation from every earlier stage's model)
    replay_share: float  # pre-training replay records per synthetic chat record in the SFT mixture (0 = chat only)
    card_n: int  # held-out items per report-card metric and model


# minutes -> size: a small table, not a formula, so every row can be checked by running it (docs/speedrun.md)
SIZES = (
    Size(minutes=0, hidden_size=64, num_hidden_layers=2, n_routed_experts=4, vocab_size=1024, corpus_mb=0.5,
         pretrain_steps=30, midtrain_steps=10, seq_len=64, mid_seq_len=128, batch_size=8,
         sft_steps=90, sft_batch_size=4, sft_seq_len=512, rl_steps=2, rl_level=3, agentic_steps=2,
         agentic_groups=2, general_steps=2, replay_share=0.05, card_n=4),
    Size(minutes=5, hidden_size=96, num_hidden_layers=3, n_routed_experts=8, vocab_size=2048, corpus_mb=3,
         pretrain_steps=800, midtrain_steps=200, seq_len=128, mid_seq_len=256, batch_size=8,
         sft_steps=130, sft_batch_size=8, sft_seq_len=512, rl_steps=40, rl_level=3, agentic_steps=6,
         agentic_groups=8, general_steps=10, replay_share=0.15,
         card_n=16),
    Size(minutes=20, hidden_size=128, num_hidden_layers=4, n_routed_experts=8, vocab_size=2048, corpus_mb=5,
         pretrain_steps=1300, midtrain_steps=300, seq_len=128, mid_seq_len=256, batch_size=8,
         sft_steps=450, sft_batch_size=8, sft_seq_len=512, rl_steps=50, rl_level=5, agentic_steps=10,
         agentic_groups=8, general_steps=10, replay_share=0.15,
         card_n=32),
    Size(minutes=60, hidden_size=192, num_hidden_layers=5, n_routed_experts=16, vocab_size=2048, corpus_mb=12,
         pretrain_steps=2000, midtrain_steps=600, seq_len=256, mid_seq_len=512, batch_size=8,
         sft_steps=400, sft_batch_size=8, sft_seq_len=512, rl_steps=80, rl_level=5, agentic_steps=20,
         agentic_groups=8, general_steps=40, replay_share=0.15,
         card_n=64),
)  # sized from per-step times on one thread of a 2-core machine (session 5: the 20-minute row ran in ~16 min quiet;
#   the 60-minute row, measured in session 19 with every post-training stage: 58 min at two threads; the 20-minute
#   row's SFT went 300 -> 450 steps in session 20: held-out tool success of seed 0's SFT model 0.73 -> 0.80; its
#   general RL 20 -> 10 steps in session 21: seed 0's reasoning accuracy 0.695 -> 0.727, tool success 0.766 both); one
#   vocabulary from 5 minutes up so the card's perplexities compare. docs/speedrun.md has the measured runs.


def size_for(minutes: float) -> Size:
    """The largest row whose `minutes` fits in the budget."""
    return [s for s in SIZES if s.minutes <= minutes][-1]



def model_overrides(size: Size, vocab_size: int) -> dict:
    """HF-named fields changed on the `tiny` preset: GLM-4.5's shape (dense first layer, top-2 of E routed
    experts + 1 shared, QK-Norm, partial RoPE, one MTP layer) at the row's width and depth."""
    d = size.hidden_size
    return {"vocab_size": vocab_size, "hidden_size": d, "num_hidden_layers": size.num_hidden_layers,
            "n_routed_experts": size.n_routed_experts, "intermediate_size": 3 * d, "moe_intermediate_size": d // 2,
            "num_attention_heads": d // 32, "num_key_value_heads": max(1, d // 64), "head_dim": 32,
            "max_position_embeddings": size.mid_seq_len}


def _val_every(steps: int, log_every: int, n: int) -> int:
    """About `n` validations per stage, on logged steps (val points share the training curves' step grid)."""
    return log_every * max(1, round(steps / n / log_every))


def pretrain(minutes: float = 20, out: str = "runs/speedrun", seed: int = 0, vocab_size: int | None = None):
    """Pre-training: Muon, warm-up + cosine spanning both stages, MTP weight 0.3, balancing bias rate 1e-3."""
    from glmstack.train.config import TrainConfig

    size, out = size_for(minutes), Path(out)
    total = size.pretrain_steps + size.midtrain_steps
    cfg = TrainConfig(run=out.name, stage="pretrain", out_dir=str(out.parent), model="tiny",
                      model_overrides=model_overrides(size, vocab_size or size.vocab_size), seed=seed,
                      seq_len=size.seq_len, micro_batch_size=size.batch_size, steps=size.pretrain_steps,
                      rope_theta=1e4, device="cpu")
    cfg.optim.lr = 3e-3  # toy scale tolerates a larger lr than GLM-4.5's 2.5e-4
    cfg.schedule = dataclasses.replace(cfg.schedule, warmup_steps=max(5, size.pretrain_steps // 20),
                                       total_steps=total, mtp_weight=[[0, 0.3]], balance_rate=[[0, 1e-3]])
    cfg.data = dataclasses.replace(cfg.data, kind="shards", path=str(out / "data" / "pretrain" / "train"),
                                   val_path=str(out / "data" / "pretrain" / "eval"), packing="concat")
    cfg.ckpt.every, cfg.ckpt.keep_last = max(10, size.pretrain_steps // 5), 1
    cfg.log.every, cfg.log.val_batches = max(1, size.pretrain_steps // 50), 4  # ~50 log lines a stage
    cfg.log.val_every = _val_every(size.pretrain_steps, cfg.log.every, 10)
    return cfg


def midtrain(minutes: float = 20, out: str = "runs/speedrun", seed: int = 0, vocab_size: int | None = None):
    """Mid-training: twice the context with RoPE base 1e4 -> 1e6, best-fit packing, repo-level code with FIM,
    the same cosine continued to 10% (step_offset), MTP weight 0.1, balancing rate 0 (GLM-4.5 §2.4)."""
    size, out = size_for(minutes), Path(out)
    cfg = pretrain(minutes, str(out), seed, vocab_size)
    cfg.stage, cfg.steps, cfg.init_from = "midtrain", size.midtrain_steps, str(out / "pretrain")
    cfg.seq_len, cfg.micro_batch_size, cfg.rope_theta = size.mid_seq_len, size.batch_size // 2, 1e6
    cfg.data = dataclasses.replace(cfg.data, packing="best_fit", path=str(out / "data" / "midtrain" / "train"),
                                   val_path=str(out / "data" / "midtrain" / "eval"))
    cfg.schedule = dataclasses.replace(cfg.schedule, step_offset=size.pretrain_steps,  # warm-up kept: same curve
                                       rewarmup_steps=cfg.schedule.warmup_steps,  # if optimizer state is not carried
                                       mtp_weight=[[0, 0.1]], balance_rate=[[0, 0.0]])
    cfg.ckpt.every = max(10, size.midtrain_steps // 3)
    cfg.log.every = max(1, size.midtrain_steps // 50)
    cfg.log.val_every = _val_every(size.midtrain_steps, cfg.log.every, 8)
    return cfg


def sft(minutes: float = 20, out: str = "runs/speedrun", seed: int = 0):
    """SFT after mid-training (docs/sft.md's speedrun proposal): hybrid thinking + tool calls on every synthetic set,
    from mid-training's newest checkpoint with the speedrun's tokenizer; the context grows to `sft_seq_len`."""
    from glmstack.recipes.sft_speedrun import SETS
    from glmstack.recipes.sft_speedrun import sft as sft_recipe

    size, out = size_for(minutes), Path(out)
    cfg = sft_recipe()
    cfg.run, cfg.out_dir, cfg.seed, cfg.steps, cfg.device = out.name, str(out.parent), seed, size.sft_steps, "cpu"
    cfg.init_from, cfg.seq_len, cfg.micro_batch_size = str(out / "midtrain"), size.sft_seq_len, size.sft_batch_size
    cfg.optim.lr = 3e-3  # as in pre-training: at toy scale 1e-3 leaves the 1-minute model without the format
    cfg.model_overrides = {"max_position_embeddings": max(size.sft_seq_len, size.mid_seq_len)}
    cfg.sft = dataclasses.replace(cfg.sft, tokenizer=str(out / "tokenizer"), synthetic_n=max(200, 16 * size.sft_steps),
                                  val_data=[f"synthetic:{s}" for s in SETS])
    cfg.schedule = dataclasses.replace(cfg.schedule, warmup_steps=max(2, size.sft_steps // 15))
    cfg.ckpt.every, cfg.ckpt.keep_last = max(5, size.sft_steps // 4), 1
    cfg.log.every = max(1, size.sft_steps // 50)
    cfg.log.val_every = _val_every(size.sft_steps, cfg.log.every, 4)
    return cfg


def tool_teachers(model: str) -> list[dict]:
    """`model` as the teacher of the tool call and of the answer from a tool's result, each with thinking off and on:
    the RL stages' own prompts are thinking-off, and distilling only that path let reasoning RL break the other
    (on seed 0 of the 20-minute row, thinking-on answers after a calculator result came back empty: 27 -> 7 of 27
    held-out items; with both modes distilled 26 of 27; docs/speedrun.md, session 20)."""
    return [{"model": model, "task": task, "thinking": on} for task in ("tools", "tool_answer") for on in (False, True)]


def rl(minutes: float = 20, out: str = "runs/speedrun", seed: int = 0):
    """Reasoning RL on the SFT model (glmstack/recipes/rl_speedrun.py at the row's step count), with the SFT model
    as the teacher of the tool skills on their own prompts in every batch (rl.teachers): without it, 50 steps on
    `compare` took the 20-minute model's tool task success from 0.66 to 0.03 (docs/speedrun.md). None while
    glmstack.posttrain.rl has no stage (the speedrun then skips RL and says so)."""
    try:
        from glmstack.recipes.rl_speedrun import rl as rl_recipe
    except ImportError:
        return None
    size, out = size_for(minutes), Path(out)
    cfg = rl_recipe()
    cfg.run, cfg.out_dir, cfg.seed, cfg.steps, cfg.device = out.name, str(out.parent), seed, size.rl_steps, "cpu"
    # four micro-batches: the teachers' long tool prompts fill the last one and the others stay short (rollouts.py
    # trims each micro-batch's trailing padding)
    cfg.init_from, cfg.grad_accum = str(out / "sft" / "model"), 4
    # 3e-4, not rl_speedrun's 1e-3: on the 20-minute SFT model (seed 0) both raise compare level 5 from 0.09 to
    # 0.45-0.47 in 50 steps, but 1e-3 takes tool task success from 0.41 to 0.14 and 3e-4 to 0.34 (docs/speedrun.md)
    cfg.optim.lr = 3e-4
    # evaluated at step 0 (the SFT model: the report card's baseline) and at the end
    cfg.rl = dataclasses.replace(cfg.rl, heldout_n=4 * size.card_n, eval_every=max(1, size.rl_steps),
                                 curriculum=[[0, size.rl_level, 8]], heldout_level=size.rl_level,
                                 teachers=tool_teachers(str(out / "sft" / "model")),
                                 teacher_samples=16, teacher_max_new_tokens=48)  # fmt: skip
    cfg.ckpt.every, cfg.ckpt.keep_last, cfg.log.every = max(1, size.rl_steps // 2), 1, 1
    return cfg


def agentic(minutes: float = 20, out: str = "runs/speedrun", seed: int = 0):
    """Agentic RL on the reasoning-RL model (GLM-5 §3.3): calculator and python tool episodes at the SFT set's level,
    synchronous (so one seed gives one result, kills included), with on-policy distillation from the reasoning-RL
    model on its own task mixed into every step (agentic.teachers; GLM-5 §3.5)."""
    from glmstack.recipes.agentic_speedrun import agentic as agentic_recipe

    size, out = size_for(minutes), Path(out)
    cfg = agentic_recipe()
    cfg.run, cfg.out_dir, cfg.seed, cfg.steps, cfg.device = out.name, str(out.parent), seed, size.agentic_steps, "cpu"
    cfg.init_from, cfg.grad_accum = str(out / "rl" / "model"), size.agentic_groups
    o = cfg.agentic
    o.envs, o.groups_per_step, o.asynchronous, o.workers = [["calculator", 1.0], ["python", 1.0]], size.agentic_groups, False, 1
    o.reset_optimizer, o.heldout_n, o.eval_every = False, 0, 0  # momentum kept across pushes (agentic_tools)
    # sampled at T = 0.5 with lr 3e-4: at T = 1 the SFT model's episodes succeed 0-14% of the time (greedy: 41%) and
    # 10 steps took held-out success down to 0.19; at T = 0.5 with lr 1e-3 down to 0.23 in 15 steps; T = 0.5 with
    # lr 3e-4 kept it (0.45 -> 0.53 at step 10; docs/speedrun.md)
    o.episode.temperature, cfg.optim.lr = 0.5, 3e-4
    o.teachers = [{"model": str(out / "rl" / "model"), "task": "compare", "level": size.rl_level}]  # GLM-5 §3.5
    o.teacher_samples, o.teacher_max_new_tokens = 2 * size.agentic_groups, 12
    cfg.ckpt.every, cfg.ckpt.keep_last, cfg.log.every = max(1, size.agentic_steps // 2), 1, 1
    return cfg


def general(minutes: float = 20, out: str = "runs/speedrun", seed: int = 0):
    """General RL on the agentic model (GLM-5 §3.4-3.5): the rules of each task (reward − its mean in the step) plus
    on-policy distillation from every earlier stage's model on its own prompts: reasoning RL on compare, agentic RL
    on tool calls and on answering from a tool's result, SFT on chat."""
    from glmstack.recipes.distill_speedrun import distill as distill_recipe

    size, out = size_for(minutes), Path(out)
    cfg = distill_recipe()
    cfg.run, cfg.stage, cfg.out_dir, cfg.seed = out.name, "general", str(out.parent), seed
    cfg.steps, cfg.device, cfg.init_from = size.general_steps, "cpu", str(out / "agentic" / "model")
    cfg.distill = dataclasses.replace(cfg.distill, reward_weight=1.0, teachers=[
        {"model": str(out / "rl" / "model"), "task": "compare", "level": size.rl_level},
        *tool_teachers(str(out / "agentic" / "model")),
        {"model": str(out / "sft" / "model"), "task": "chat"}])  # fmt: skip
    cfg.rl = dataclasses.replace(cfg.rl, samples_per_step=24 if minutes >= 5 else 8, heldout_n=0, eval_every=0)
    cfg.micro_batch_size, cfg.grad_accum = cfg.rl.samples_per_step // 2, 2
    cfg.ckpt.every, cfg.ckpt.keep_last, cfg.log.every = max(1, size.general_steps // 2), 1, 1
    return cfg


# mid-training corpus: mostly code, a quarter of it whole standard-library packages as repo-level documents
MIDTRAIN_SHARES = {"stdlib-repos": 0.45, "stdlib-code": 0.3, "docstrings": 0.1, "pydoc": 0.05, "math": 0.1}


def corpus_config(minutes: float, seed: int, shares: dict | None = None):
    """The embedded corpus at the row's size (`shares`: the mid-training mix, or None for the default one)."""
    from glmstack.data.corpus import CorpusConfig

    cfg = CorpusConfig(size_mb=size_for(minutes).corpus_mb, seed=seed)
    return dataclasses.replace(cfg, shares=shares) if shares else cfg


def data():
    """The data build the speedrun starts from (`glmstack data speedrun`): ~2 MB, SemDeDup with the cheap embedder."""
    from glmstack.data.corpus import CorpusConfig
    from glmstack.data.pipeline import PipelineConfig

    return PipelineConfig(corpus=CorpusConfig(size_mb=2.0), unit_docs=128)
