"""`glmstack rl <recipe> [--set key=value ...]`: reasoning RL (GRPO without KL, clip-higher, IcePop) on the one loop.

GLM-5 §3.2 Eq. 1 / GLM-4.5 §3.2 (research/rl-recipe.md §1): per optimizer step
  weights -> rollout engine (in process; `rl.rollout_dtype=bfloat16` makes a real train/inference mismatch)
  -> prompts × group_size rollouts with the engine's own per-token log-probs -> rewards -> group advantages
     (dynamic sampling drops zero-variance groups and over-samples) -> micro-batches       (rollouts.py)
  -> this loss: log-probs from the trainer's logits / the rollout temperature over the same top-k / top-p nucleus,
     old log-probs = their detached copy (one optimizer step per rollout batch: on-policy; with rl.ppo_epochs /
     rl.minibatches > 1, the trainer's log-probs at the rollout weights, computed by rollouts.py), the policy loss
     (rl.loss: grpo = clipped surrogate with rl.mismatch none | tis | icepop; dis; cispo; gspo)  (losses.py),
     or ppo: the same surrogate on per-token GAE advantages + a value head's clipped loss        (ppo.py)
  -> the loop's optimizer step, guard, checkpoint, metrics.jsonl.
The curriculum is a stage table `rl.curriculum` = [[from_step, level, group_size(, hard_k)], ...]; dynamic temperature
(`rl.dynamic_temperature`) raises the temperature when the reward plateaus. The dashboard (metrics.jsonl, plots/,
rl_summary.json) is described in docs/rl.md, with why a policy loss near 0 is expected.

    glmstack rl rl_speedrun                                   # the SFT'd speedrun model on the compare task
    glmstack rl rl_speedrun --set rl.mismatch=none --set rl.rollout_dtype=bfloat16 --set seed=1
    glmstack rl rl_tiny --set steps=4                         # a random tiny model on the token task (smoke test)
    glmstack rl rl_tiny --set rl.loss=ppo --set steps=8       # PPO with a critic (docs/rl.md)
`glmstack rl` runs every RL path, the recipe's config naming which (glmstack/stage_cli.py): `glmstack rl
agentic_speedrun` is agentic RL (an AgenticConfig; alias `glmstack agentic-rl`), `glmstack rl distill_speedrun`
on-policy distillation (alias `glmstack distill`), `glmstack rl vl_tiny` a vision-language policy (alias `glmstack
vl-rl`). They share this loss, posttrain/sample.py's Sample + collate and posttrain/policy.py's Policy.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch

from glmstack.config import ConfigError
from glmstack.model.invariant import batch_invariant
from glmstack.posttrain.rl.losses import (
    cispo_loss,
    dis_loss,
    distill_advantages,
    entropy,
    gspo_loss,
    policy_loss,
    regularised,
    token_logprobs,  # fmt: skip
)
from glmstack.posttrain.rl.ppo import ppo_objective
from glmstack.posttrain.rl.replay import model_routes, routing_diff
from glmstack.train import dist
from glmstack.train.config import DistConfig, TrainConfig
from glmstack.train.loop import VISION_INPUTS


@dataclass(kw_only=True)
class RLOptions:
    task: str = "arithmetic"  # tasks.TASKS: arithmetic | compare | code | toy, or reasoning_gym:<dataset>
    rewards: list[list] = field(default_factory=list)  # [[name, weight], ...] (rewards.REWARDS); [] = the task's
    samples_per_step: int = 64  # rollouts per rollout batch (prompts × group size); split into grad_accum parts
    # PPO-style updates: each rollout batch is cut into `minibatches` parts, one optimizer step each, and passed over
    # `ppo_epochs` times; then old_logp = the trainer's log-probs at the rollout weights, computed once before the
    # first update (1 and 1 = GLM-5's on-policy default: one optimizer step per rollout batch, old_logp = logp.detach())
    ppo_epochs: int = 1
    minibatches: int = 1
    # [[from_step, level, group_size(, hard_k)]]: hard_k > 0 trains only problems whose first hard_k samples all
    # fail and some later one succeeds (GLM-4.5's stage 2: pass@8 = 0, pass@512 > 0; rollouts.informative)
    curriculum: list[list[int]] = field(default_factory=lambda: [[0, 0, 8]])
    max_new_tokens: int = 24  # response budget per rollout
    temperature: float = 1.0  # rollout temperature (> 0); the trainer divides its logits by the same
    top_p: float = 1.0  # rollout nucleus; the trainer's log-probs use the same
    top_k: int = 0  # rollout top-k; likewise
    # grpo = GLM-5 Eq. 1 with rl.mismatch; ppo = the clipped surrogate + a critic on the trunk (ppo.py, docs/rl.md)
    loss: Literal["grpo", "dis", "cispo", "gspo", "ppo"] = "grpo"
    mismatch: Literal["none", "tis", "icepop"] = "icepop"  # train/inference correction (GLM-5: IcePop, β = 2)
    mismatch_low: float = 0.5  # 1/β
    mismatch_high: float = 2.0  # β
    eps_low: float = 0.2  # clip-higher (DAPO; GLM-5); also dis's and cispo's (MiniMax-M1's cispo: eps_low=1)
    eps_high: float = 0.28
    reduction: Literal["sample", "token"] = "sample"  # GLM-5: per-sample mean; GLM-4.5 code RL: token mean
    std_normalize: bool = True  # GRPO advantage / group std (GLM-5 Eq. 1); False = Dr.GRPO's R − mean
    entropy_coef: float = 0.0  # entropy bonus (off in GLM-5's reasoning RL)
    # rl.loss=ppo only (ppo.py): per-token KL-in-reward to the frozen initial model, GAE, the critic's loss
    kl_coef: float = 0.05  # r_t = −kl_coef · (log π_old − log π_ref), the sequence reward at the last token
    gamma: float = 1.0  # GAE discount
    gae_lambda: float = 0.95  # GAE λ
    value_clip: float = 0.2  # V_old ± value_clip (PPO2's clipped value loss); 0 = unclipped
    vf_coef: float = 0.1  # loss = policy loss + vf_coef · value loss
    whiten_advantages: bool = True  # advantages (x − mean) / std over the rollout batch's response tokens
    dynamic_sampling: bool = True  # drop groups whose rewards are all equal, over-sample to refill (DAPO)
    oversample: int = 2  # an over-sampling round asks this many times the missing prompts
    oversample_rounds: int = 1  # extra rounds at most (then zero-variance groups fill the batch)
    dynamic_temperature: bool = False  # GLM-4.5: raise the temperature when the reward plateaus
    temperatures: list[float] = field(default_factory=lambda: [0.8, 1.0, 1.2, 1.4])  # candidates of the sweep
    plateau_window: int = 5  # steps per window of the plateau test
    plateau_tol: float = 0.01  # |mean reward change| below this between two windows = a plateau
    rollout_dtype: Literal["float32", "bfloat16"] = "float32"  # the rollout engine's weights
    rollout_noise: float = 0.0  # a controlled mismatch: rollout weights + noise · std(weight) (per step)
    # the sampler and the trainer compute every log-prob with the same batch-invariant ops (model/invariant.py) in
    # the trainer's precision: rollout log-probs equal the trainer's bit for bit (logp_diff_frac = 0 every step)
    true_on_policy: bool = False
    # the MTP layer keeps drafting for the trunk RL changes (slime's --enable-mtp-training): its loss on the rollout
    # tokens, weighted; with mtp_detach_trunk the trunk gets no gradient from it (only the RL objective moves the
    # policy). The acceptance length of MTP speculative decoding is measured at every held-out evaluation
    mtp_weight: float = 0.0
    mtp_detach_trunk: bool = True
    # partial rollouts (APRIL; partial.py): draw (1 + partial_oversample) x the batch's groups, stop decoding once
    # the batch's groups are complete, continue the unfinished rows first next step (dropped when > tau steps old)
    partial_rollouts: bool = False
    partial_oversample: float = 0.5
    # Rollout Routing Replay (R3, replay.py): off | record (the engine's experts recorded, the trainer's routing
    # compared with them: routing_diff_frac) | replay (the trainer routes every token to the recorded experts)
    routing_replay: Literal["off", "record", "replay"] = "off"
    rollout_server: str = ""  # an OpenAI-compatible server's URL (remote.py) instead of the in-process engine
    server_model: str = "glmstack"  # the `model` field sent to it
    sync_every: int = 1  # push the trainer's weights to the rollout engine / server every K trainer steps
    tau: int = 0  # staleness bound in trainer steps: a rollout from older weights is an error (>= sync_every - 1)
    # its --api-key; "" = $GLMSTACK_API_KEY or none. The resolved config is written beside checkpoints, so prefer the
    # environment variable for a key that matters
    rollout_server_key: str = ""
    # where the trainer writes its weight pushes: inside the server's --weight-root; "" = a private temporary folder
    rollout_weights_dir: str = ""
    # a LoRA policy's pushes to the server: "adapter" (its adapters alone, served under server_model beside the
    # base: `glmstack serve BASE --enable-lora`) or "merged" (W + s·BA, the whole model: servers without LoRA)
    server_lora: Literal["adapter", "merged"] = "adapter"
    # on-policy distillation from earlier stages' models mixed into every rollout batch (GLM-5 §3.5; teachers.py):
    # [{"model": FOLDER_OR_RUN/STAGE, "task": "tools", "weight": 1.0, "level": 0}, ...]; `teacher_samples` prompts of
    # their tasks per batch, one sample each from the rollout policy, Eq. 2's advantage on those rows
    teachers: list[dict] = field(default_factory=list)
    teacher_samples: int = 16
    teacher_max_new_tokens: int = 48
    eval_every: int = 5  # steps between held-out evaluations (greedy), 0 = only at the start and end
    heldout_n: int = 64  # held-out problems
    heldout_level: int = 0  # their difficulty level
    chat_style: str = "glm-4.5"  # prompt rendering (chat tasks)
    thinking: bool = False  # enable_thinking of the chat prompts
    toy_stop_id: int = 1  # the token task's stop id (no tokenizer)


@dataclass(kw_only=True)
class RLConfig(TrainConfig):
    rl: RLOptions = field(default_factory=RLOptions)
    # the RL loss reads the logits only: under DDP the MTP layer gets no gradient
    dist: DistConfig = field(default_factory=lambda: DistConfig(find_unused_parameters=True))


# ---------------------------------------------------------------------------------------------------- loss
def rl_loss(opts: RLOptions):
    """loss_fn(model, batch, values) for the loop: the policy loss of one rollout micro-batch + dashboard figures."""

    def loss_fn(model, batch: dict, values: dict):
        vision = {k: batch[k] for k in VISION_INPUTS if k in batch}  # a vision-language policy's pixels
        mtp_weight = getattr(opts, "mtp_weight", 0.0)
        mtp = {"mtp_labels": batch["targets"].masked_fill(batch["mask"] <= 0, -100),
               "mtp_detach_trunk": opts.mtp_detach_trunk} if mtp_weight else {}  # fmt: skip
        # routing replay (replay.py): the engine's recorded experts replayed, the trainer's own top-k returned
        routing = model_routes(getattr(opts, "routing_replay", "off"), batch, own=True)
        segments = {k: batch[k] for k in ("segment_ids", "position_ids") if k in batch}  # folded contexts (sample.py)
        with batch_invariant(getattr(opts, "true_on_policy", False)):  # the sampler's ops (policy.trainer_numerics)
            out = model(batch["input_ids"], **vision, **routing, **mtp, **segments)
        logits_BTV = out.logits.float()
        temp = batch["temperature"]
        logp_BT = token_logprobs(logits_BTV, batch["targets"], temp, opts.top_p, opts.top_k)
        valid = (batch["mask"] > 0) & torch.isfinite(logp_BT)  # a token outside the trainer's nucleus: dropped
        logp_BT = torch.where(valid, logp_BT, torch.zeros_like(logp_BT))
        if "old_logp" in batch:  # PPO-style updates: π_old = the trainer at the rollout weights (rollouts.py)
            valid = valid & torch.isfinite(batch["old_logp"])
            logp_BT = torch.where(valid, logp_BT, torch.zeros_like(logp_BT))
            old = torch.where(valid, batch["old_logp"], torch.zeros_like(logp_BT))
        else:  # one optimizer step per rollout batch: π_old is the trainer at these very weights
            old = logp_BT.detach()
        mask, rollout, adv = valid.float(), batch["rollout_logp"], batch["advantages"]
        if "teacher_logp" in batch:  # on-policy distillation (teachers.py): GLM-5 Eq. 2's per-token advantage,
            # added to the row's own (distill: general RL's rules or 0) on the teachers' rows (all, or teacher_rows)
            rows = batch.get("teacher_rows", torch.ones(mask.shape[0], dtype=torch.bool, device=mask.device))
            teach = distill_advantages(batch["teacher_logp"], logp_BT) * mask * rows[:, None]
            adv = adv.unsqueeze(-1).expand_as(teach) + teach if adv.dim() == 1 else adv + teach
        if opts.loss == "grpo":
            loss, stats = policy_loss(logp_BT, old, adv, mask, rollout_logp=rollout, eps_low=opts.eps_low,
                                      eps_high=opts.eps_high, reduction=opts.reduction, mismatch=opts.mismatch,
                                      mismatch_low=opts.mismatch_low, mismatch_high=opts.mismatch_high)  # fmt: skip
        elif opts.loss == "dis":
            loss, stats = dis_loss(logp_BT, rollout, adv, mask, eps_low=opts.eps_low, eps_high=opts.eps_high,
                                   reduction=opts.reduction)  # fmt: skip
        elif opts.loss == "ppo":  # the critic reads this forward's trunk; the batch carries GAE's fields (ppo.py)
            loss, stats = ppo_objective(model, out.hidden, logp_BT, old, mask, batch, opts)
        elif opts.loss == "cispo":
            loss, stats = cispo_loss(logp_BT, old, adv, mask, eps_low=opts.eps_low, eps_high=opts.eps_high,
                                     reduction=opts.reduction)  # fmt: skip
        else:
            loss, stats = gspo_loss(logp_BT, old, adv, mask)
        ent_BT = entropy(logits_BTV, temp)
        loss = regularised(loss, mask, entropy_BT=ent_BT, entropy_coef=opts.entropy_coef, reduction=opts.reduction)
        if mtp_weight and out.mtp_loss:
            mtp_loss = torch.stack(out.mtp_loss).mean()
            loss, stats = loss + mtp_weight * mtp_loss, stats | {"mtp_loss": float(mtp_loss.detach())}
        m = mask.sum().clamp(min=1)
        metrics = {"entropy": (ent_BT.detach() * mask).sum() / m,
                   "outside_nucleus_frac": float(((batch["mask"] > 0) & ~valid).sum()) / float(m),
                   "mean_abs_logp_diff": float(((old - rollout).abs() * mask).sum() / m),
                   # trained tokens whose rollout log-prob is not the trainer's bit for bit (0 under true on-policy)
                   "logp_diff_frac": float(((old != rollout) & (mask > 0)).sum()) / float(m),
                   # slime's ppo_kl: 0 at a batch's first update, bit for bit (rollouts.py computes π_old in the
                   # first update's micro-batch shapes), and the drift of π_θ from π_old after it
                   "ppo_kl": float(((old - logp_BT.detach()) * mask).sum() / m)}  # fmt: skip
        if routing:  # the trainer's own top-k against the engine's (in replay mode: what the replay removed)
            metrics |= routing_diff(out.routes, batch["routes"], mask)
        return loss, stats | metrics | batch["stats"]

    return loss_fn


# ---------------------------------------------------------------------------------------------------- stage
def check_sampling(cfg: RLConfig) -> None:
    """What every RL data stream needs (rl, distill): updates per batch, a sampling temperature, no batch warm-up."""
    o = cfg.rl
    if o.ppo_epochs < 1 or o.minibatches < 1:
        raise ConfigError("rl.ppo_epochs and rl.minibatches must be >= 1")
    if o.temperature <= 0:
        raise ConfigError("rl.temperature must be > 0 (RL samples; the trainer divides its logits by it)")
    if cfg.schedule.batch_warmup_start_tokens:
        raise ConfigError("schedule.batch_warmup_start_tokens: RL batches are rollouts; no batch-size warm-up")


def check_true_on_policy(o) -> None:
    """rl.true_on_policy (and agentic.true_on_policy) samples in process, in the trainer's weights and precision."""
    if not getattr(o, "true_on_policy", False):
        return
    if o.rollout_server:
        raise ConfigError("true_on_policy samples in process with the trainer's ops: drop rollout_server")
    if getattr(o, "rollout_dtype", "float32") != "float32" or getattr(o, "rollout_noise", 0.0):
        raise ConfigError("true_on_policy: rollout_dtype=bfloat16 and rollout_noise make a mismatch on purpose; "
                          "for bf16 on both sides set dtype=bfloat16 (the trainer's autocast, which the sampler "
                          "then runs under too)")  # fmt: skip


def check_partial(o) -> None:
    """rl.partial_rollouts: what partial.py supports today (single-turn, no selection; in process or on a rollout
    server, one rank or several)."""
    if not o.partial_rollouts:
        return
    if o.partial_oversample < 0:
        raise ConfigError("rl.partial_oversample must be >= 0")
    if o.partial_oversample > 0 and o.tau < 1:
        raise ConfigError("rl.partial_rollouts resumes rows the next step: set rl.tau >= 1 (their staleness bound)")
    if o.dynamic_sampling or o.routing_replay != "off":
        raise ConfigError("rl.partial_rollouts runs with rl.dynamic_sampling=false and rl.routing_replay=off (not "
                          "yet: agentic RL)")  # fmt: skip


def check(cfg: RLConfig) -> None:
    from glmstack.posttrain.rl.rollouts import check_divisible, stage_at
    from glmstack.posttrain.rl.tasks import TASKS
    from glmstack.posttrain.rl.teachers import check_teachers

    if not isinstance(cfg, RLConfig):
        raise ConfigError(f"the rl stage needs an RLConfig (got {type(cfg).__name__})")
    o = cfg.rl
    if o.task not in TASKS and not o.task.startswith("reasoning_gym:"):
        raise ConfigError(
            f"rl.task: unknown task {o.task!r} (expected one of {', '.join(TASKS)}, reasoning_gym:<name>)"
        )
    check_sampling(cfg)
    if o.sync_every < 1 or o.tau < o.sync_every - 1:
        raise ConfigError(f"rl.sync_every={o.sync_every} must be >= 1 and rl.tau={o.tau} >= sync_every - 1 (rollouts "
                          "between two pushes are up to sync_every - 1 steps old)")  # fmt: skip
    if not o.curriculum or any(len(r) not in (3, 4) for r in o.curriculum):
        raise ConfigError("rl.curriculum: give rows [from_step, level, group_size] or [..., hard_k]")
    if o.loss == "ppo":
        check_ppo(cfg)
    else:
        check_ppo_only(o)
    check_true_on_policy(o)
    check_partial(o)
    check_teachers(o.teachers, "rl.teachers", o.teacher_samples, dist.world() * cfg.grad_accum * o.minibatches)
    if o.teachers and (o.loss == "ppo" or o.routing_replay != "off"):
        raise ConfigError("rl.teachers: the teachers' rows have no critic rewards (rl.loss=ppo) and no recorded "
                          "routes (rl.routing_replay); turn one of them off")  # fmt: skip
    for _, _, group, hard_k in (stage_at(o.curriculum, r[0]) for r in o.curriculum):
        if hard_k >= group:
            raise ConfigError(f"rl.curriculum: hard_k={hard_k} must be below the group size {group}")
        problem = check_divisible(o.samples_per_step, int(group), cfg.grad_accum * o.minibatches)
        if problem:
            raise ConfigError(problem)


PPO_ONLY = ("kl_coef", "gamma", "gae_lambda", "value_clip", "vf_coef", "whiten_advantages")


def check_ppo_only(o: RLOptions) -> None:
    """The critic's and the KL-in-reward's options are PPO's: set on another loss they would do nothing."""
    changed = [f"rl.{k}" for k in PPO_ONLY if getattr(o, k) != getattr(RLOptions(), k)]
    if changed:
        raise ConfigError(f"{', '.join(changed)}: PPO's options (rl.loss=ppo); rl.loss={o.loss} has no critic and "
                          "no KL term to the start model")  # fmt: skip


def check_ppo(cfg: RLConfig) -> None:
    """What rl.loss=ppo supports: one process (the value head joins the GLM after it is built), the in-process
    rollout engine (a server run is not tested with it), GAE's and the critic's ranges."""
    import os

    o = cfg.rl
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ConfigError("rl.loss=ppo runs in one process (its value head is not built for DDP / FSDP); launch "
                          "without torchrun")  # fmt: skip
    if o.rollout_server:
        raise ConfigError("rl.loss=ppo rolls out in process only (not tested with a rollout server); unset "
                          "rl.rollout_server")  # fmt: skip
    if not (0 < o.gamma <= 1 and 0 <= o.gae_lambda <= 1 and o.value_clip >= 0 and o.vf_coef > 0 and o.kl_coef >= 0):
        raise ConfigError(f"rl.loss=ppo: need 0 < rl.gamma <= 1, 0 <= rl.gae_lambda <= 1, rl.value_clip >= 0, "
                          f"rl.vf_coef > 0, rl.kl_coef >= 0 (got {o.gamma}, {o.gae_lambda}, {o.value_clip}, "
                          f"{o.vf_coef}, {o.kl_coef})")  # fmt: skip


def load_tokenizer(cfg: RLConfig):
    """The init_from folder's tokenizer, or None (the token task needs none)."""
    from glmstack.train.export import stage_tokenizer

    return stage_tokenizer(cfg, required=False)


def build(cfg: RLConfig, model, tokenizer):
    from glmstack.posttrain.rl.rollouts import Rollouts
    from glmstack.posttrain.rl.tasks import make_task
    from glmstack.posttrain.rl.teachers import build_mix

    try:
        task = make_task(cfg.rl.task, tokenizer, cfg.rl.chat_style, cfg.rl.thinking)
        return Rollouts(model=model, task=task, opts=cfg.rl, seed=cfg.seed, micro_batches=cfg.grad_accum,
                        tokenizer=tokenizer, style=cfg.rl.chat_style, reference=reference(cfg),
                        autocast=trainer_autocast(cfg),
                        mix=build_mix(cfg, cfg.rl, "rl.teachers", tokenizer, cfg.rl.chat_style))  # fmt: skip
    except ValueError as e:
        raise ConfigError(f"rl: {e}") from None


def trainer_autocast(cfg) -> torch.dtype | None:
    """The loop's autocast dtype for this config (None: fp32), which π_old and a true on-policy sampler share."""
    from glmstack.train.loop import autocast_dtype, device_of

    return autocast_dtype(cfg, device_of(cfg))


def reference(cfg: RLConfig):
    """PPO's frozen reference for the KL-in-reward: the stage's starting model (init_from or the seeded init), in
    eval mode without gradients; None for the other losses."""
    if cfg.rl.loss != "ppo":
        return None
    from glmstack.train.loop import device_of
    from glmstack.train.stage import initial_model

    return initial_model(cfg, device_of(cfg)).eval().requires_grad_(False)


def run_rl(cfg: RLConfig, stop_at: int | None = None, build_data=build, check_fn=check) -> dict:
    """Model and optimiser as every stage builds them, rollouts as the data, the RL loss; then the held-out score
    of the final weights (rl_summary.json), the dashboard plots and (with a tokenizer) an HF model folder.
    `build_data` / `check_fn`: another data stream and its own checks (distill.py)."""
    from glmstack.posttrain.rl.ppo import attach_value_head
    from glmstack.train.loop import train
    from glmstack.train.stage import model_and_optimizer, stage_dir

    check_fn(cfg)
    model, optimizer = model_and_optimizer(cfg)
    if cfg.rl.loss == "ppo":  # the critic: a value head on the trunk, optimised with the policy (ppo.py)
        optimizer = attach_value_head(model, cfg.optim, cfg.seed)
    tokenizer = load_tokenizer(cfg)
    data = build_data(cfg, model, tokenizer)  # Rollouts; distill.py passes its teachers' stream
    folder = stage_dir(cfg)
    result = train(model=model, optimizer=optimizer, data=data, cfg=cfg, stage_dir=folder, loss_fn=rl_loss(cfg.rl),
                   stop_at=stop_at)  # fmt: skip
    if result["stopped"] == "done":  # on every rank: gathering a sharded policy is collective
        data.sync(perturb=False, force=True)  # the rollout engine / server ends on the trained weights too
        data.prepare_eval()  # the weights being exported
    if dist.rank() == 0 and result["stopped"] == "done":
        from glmstack.posttrain.rl.dashboard import plot_dashboard, summary

        if cfg.rl.heldout_n:  # 0: no held-out evaluation (the speedrun's card scores the model instead)
            result |= data.heldout_scores()  # heldout_acc (+ heldout_reward when rl.rewards is not the task's)
            if hasattr(data, "evaluate_all"):  # one held-out score per task (distillation: per teacher)
                result["heldout"] = data.evaluate_all()
            result["heldout_acc_sampled"] = data.evaluate(data.temperature)
        result |= data.mtp_acceptance() if hasattr(data, "mtp_acceptance") else {}
        report = summary(folder, result)
        (folder / "rl_summary.json").write_text(json.dumps(report, indent=2) + "\n")
        if cfg.rl.true_on_policy:
            print(f"true on-policy: rollout log-probs {'==' if report['logp_bitwise_every_step'] else '!='} the "
                  f"trainer's, bit for bit, at every step (logp_diff_frac, {folder / 'rl_summary.json'})")  # fmt: skip
        if cfg.log.plots:
            plot_dashboard(folder)
        if tokenizer is not None:
            from glmstack.train.export import export_checkpoint as export

            result["model"] = str(export(Path(result["checkpoint"]), folder / "model", tokenizer, cfg.rl.chat_style))
    return result


def main(argv: list[str] | None = None) -> int:
    from glmstack.stage_cli import main_for

    return main_for("rl", __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
