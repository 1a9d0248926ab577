"""The RL data stream: each optimizer step's micro-batches are rollouts generated with the current weights.

How RL runs on the one loop (glmstack/train/loop.py): the loop asks the data for `grad_accum` micro-batches per step;
`Rollouts` answers the first request of a step by
  weight sync    copy the trainer's weights into the rollout engine's model (optionally bf16: a real mismatch)
  rollout        `prompts × group_size` samples from inference.Engine with per-row seeds and `logprobs=True`:
                 the rollout log-probs are the ones the engine computed when it sampled (tokens in, tokens out)
  reward         the registered rewards on the batch (rewards.py; the sandbox runs code tests in parallel)
  advantages     GRPO's group advantages (losses.group_advantages); dynamic sampling drops groups whose rewards
                 are all equal (zero gradient) and samples more prompts, `rl.oversample_rounds` times at most
and then hands out that batch's micro-batches: `input_ids (B, L)` prompt + response, right padded; `targets (B, L)`
the next token; `mask (B, L)` 1 where the target is a response token; `rollout_logp (B, L)`; `advantages (B,)`;
`temperature`, `stats` (the dashboard's rollout figures); with `rl.routing_replay` record or replay, `routes (B, L,
n MoE layers, K)`, the engine's experts per input token (replay.py). Every micro-batch of a step is padded to the same length
so the loop's per-micro-batch weights (by input tokens) are equal and a sample-mean reduction stays exact.
With PPO-style updates (`rl.ppo_epochs` × `rl.minibatches` optimizer steps per rollout batch) the batch also carries
`old_logp (B, L)`: the trainer's log-probs at the rollout weights, computed once before the first update; each epoch
visits the samples in a fresh order (a pure function of seed, step and epoch) cut into `minibatches` steps.
With `rl.loss=ppo` (ppo.py) the hook `ppo.rollout_fields` computes, at the same point, `old_logp`, the critic's
`values`, the `kl` to the frozen reference, and per-token GAE `advantages (B, L)` and `returns`.

Several ranks (DDP / FSDP2 / expert parallel): `rl.samples_per_step` is the global batch. Every rank draws the
step's prompts as one process would and takes its contiguous share of the groups, sampling each row with the seed
of its global row index; every rank's rollout engine holds the whole policy (the unsharded state, gathered on
each sync); batches are padded to one length over all ranks, so the loop weights every micro-batch alike and a
step equals one process accumulating all ranks' micro-batches (tests/dist/test_rl_dist.py). Dynamic sampling is
global too: every round (the batch, then each refill) is one draw split over the ranks, every rank sees all groups
in global order (an all-gather of the sampled groups), keeps the first informative ones as one process would, and
trains its contiguous share of them.

Everything is a pure function of (seed, step): the prompts, the per-row sampling seeds and the held-out set, so the
state (`state_dict`) is the step counter, the temperature, the reward history and the micro-batches of the current
rollout batch not yet trained on (PPO-style updates), and a resumed run generates exactly what the uninterrupted one
did (tests/posttrain/test_rl_stage.py).
"""

from __future__ import annotations

import time
import zlib

import torch

from glmstack.posttrain.rl import rewards as reward_lib
from glmstack.posttrain.rl.losses import group_advantages, token_logprobs
from glmstack.posttrain.rl.ppo import rollout_fields
from glmstack.posttrain.rl.replay import check_model, model_routes
from glmstack.posttrain.sample import Sample, collate
from glmstack.train import dist


def stable_seed(*parts) -> int:
    return zlib.crc32(":".join(map(str, parts)).encode()) & 0x7FFFFFFF


def stage_at(table: list[list[float]], step: int) -> list[float]:
    """The curriculum row in force at `step`: the last [from_step, level, group_size(, hard_k)] with
    from_step <= step, as [from_step, level, group_size, hard_k] (hard_k 0 when the row has none)."""
    row = table[0]
    for r in table:
        if r[0] <= step:
            row = r
    return list(row) + [0] * (4 - len(row))


def informative(rewards: list[float], hard_k: int) -> bool:
    """A group worth training on: its rewards differ (else its advantages, and gradient, are 0); with `hard_k`, also
    a hard problem for the current policy (GLM-4.5's second curriculum stage: pass@k = 0 on the group's first k
    samples, a success among the rest; a success is a reward > 0)."""
    if len(set(rewards)) == 1:
        return False
    return not hard_k or (max(rewards[:hard_k]) <= 0 < max(rewards[hard_k:], default=0))


def pick_temperature(scores: dict[float, float], tolerance: float = 0.01) -> float:
    """GLM-4.5 §3.2's dynamic temperature: the highest temperature whose held-out score is within `tolerance`
    (absolute, 1% by default) of the best one."""
    best = max(scores.values())
    return max(t for t, s in scores.items() if s >= best - tolerance)


def plateaued(history: list[float], window: int, tol: float) -> bool:
    """The mean reward of the last `window` steps moved less than `tol` from the `window` before."""
    if window <= 0 or len(history) < 2 * window:
        return False
    last, before = history[-window:], history[-2 * window : -window]
    return abs(sum(last) / window - sum(before) / window) < tol


class Rollouts:
    """Iterable of RL micro-batches for the loop (see the module docstring); `state_dict` makes resume exact."""

    def __init__(self, *, model, task, opts, seed: int, micro_batches: int, tokenizer=None, style="glm-4.5",
                 reference=None, autocast=None, mix=None):  # fmt: skip
        self.policy, self.task, self.opts, self.seed = model, task, opts, seed
        self.mix = mix  # teachers.py's TeacherMix: cross-stage distillation rows in every batch (rl.teachers), or None
        self.autocast = autocast  # the trainer's autocast dtype (None: fp32): π_old's and a true on-policy sampler's
        self.reference = reference  # rl.loss=ppo: the frozen model of the KL-in-reward (ppo.py)
        self.micro_batches, self.tokenizer, self.style = micro_batches, tokenizer, style
        self.weights = [tuple(w) for w in opts.rewards] or [(r, 1.0) for r in task.rewards]
        for name, _ in self.weights:
            reward_lib.get(name)
        self.step, self.temperature, self.history = 0, float(opts.temperature), []
        self.queue: list[dict] = []
        self.pending: list[dict] = []  # rl.partial_rollouts: groups in flight between steps (partial.py)
        self.next_uid = 0  # their ids (each row's seed derives from its group's)
        self.gen_stats: dict = {}
        self.engine = self.eval_engine = None
        self.media: list = []  # a VL batch's pixels per row (multimodal.processor.Media), else empty
        self.version: int | None = None  # the trainer step whose weights the rollout engine holds
        self.check_ranks()
        check_model(opts.routing_replay, dist.unwrap(model))
        self.heldout = task.problems(split="test", n=opts.heldout_n, seed=seed, level=opts.heldout_level)

    # ------------------------------------------------------------------ the loop's protocol
    def __iter__(self):
        return self

    def __next__(self) -> dict:
        if not self.queue:
            self.queue = self.make_step()
        return self.queue.pop(0)

    def state_dict(self) -> dict:
        return {"step": self.step, "temperature": self.temperature, "history": list(self.history),
                "queue": list(self.queue), "pending": list(self.pending), "next_uid": self.next_uid}  # fmt: skip

    def load_state_dict(self, state: dict) -> None:
        self.step, self.temperature = int(state["step"]), float(state["temperature"])
        self.history, self.queue = list(state["history"]), list(state.get("queue", []))
        self.pending, self.next_uid = list(state.get("pending", [])), int(state.get("next_uid", 0))

    def check_ranks(self) -> None:
        """The global batch must split into whole groups per rank and whole micro-batches per rank."""
        from glmstack.config import ConfigError

        W, o = dist.world(), self.opts
        for _, _, group, _ in (stage_at(o.curriculum, r[0]) for r in o.curriculum):
            per_rank = o.samples_per_step // W
            if o.samples_per_step % (int(group) * W) or per_rank % (self.micro_batches * o.minibatches):
                raise ConfigError(f"rl.samples_per_step={o.samples_per_step} must split into {W} ranks x whole groups "
                                  f"of {int(group)}, each rank's share into grad_accum x rl.minibatches = "
                                  f"{self.micro_batches * o.minibatches} micro-batches")  # fmt: skip

    @property
    def updates(self) -> int:
        """Optimizer steps per rollout batch."""
        return self.opts.ppo_epochs * self.opts.minibatches

    # ------------------------------------------------------------------ the rollout engine
    def sync(self, perturb: bool = True, force: bool = False) -> float:
        """Push the trainer's whole (unsharded) weights to the rollout policy when due (every `rl.sync_every` steps,
        or `force`): the in-process copy (made on first use, in `rl.rollout_dtype`, then `rl.rollout_noise` unless
        `perturb` is False) or the rollout server (posttrain/policy.py). The version is the trainer step."""
        from glmstack.posttrain.policy import make_policy

        t0 = time.perf_counter()
        if not (force or self.version is None or self.step - self.version >= self.opts.sync_every):
            return 0.0
        state, o = self.full_state(), self.opts
        if self.engine is None:
            server = (o.rollout_server, o.server_model, o.rollout_server_key or None) if o.rollout_server else None
            self.engine = make_policy(None if server else self.plain_model(state), self.tokenizer, server=server,
                                      weights_dir=o.rollout_weights_dir, dtype=o.rollout_dtype,
                                      perturb=self.perturb, invariant=o.true_on_policy,
                                      autocast=self.autocast if o.true_on_policy else None)  # fmt: skip
        self.engine.perturb = self.perturb if perturb and not o.rollout_server else None
        if o.rollout_server:
            from glmstack.posttrain.policy import served_state

            state = served_state(self.policy, state, o.server_lora)  # a LoRA policy: its adapters, or merged
        self.engine.push(state, self.step)
        self.version = self.step
        return time.perf_counter() - t0

    def prepare_eval(self) -> None:
        """Held-out evaluation scores the trainer's current weights, the ones exported: the rollout copy when it
        holds exactly them (synced this step, fp32, unperturbed), else an in-process copy loaded now (a server's,
        a perturbed, bf16 or older copy is never what is scored). Collective with several ranks."""
        from glmstack.posttrain.policy import EnginePolicy

        o = self.opts
        if not o.rollout_server and self.version == self.step and o.rollout_dtype == "float32" and not o.rollout_noise:
            self.eval_engine = self.engine
            return
        state = self.full_state()
        if self.eval_engine is None or self.eval_engine is self.engine:
            self.eval_engine = EnginePolicy(self.plain_model(state), self.tokenizer)
        self.eval_engine.push(state, self.step)

    def full_state(self) -> dict:
        from glmstack.posttrain.policy import full_state

        return full_state(self.policy)

    def plain_model(self, state: dict):
        from glmstack.posttrain.policy import plain_copy

        return plain_copy(self.policy, state)

    @torch.no_grad()
    def perturb(self, model) -> None:
        """`rl.rollout_noise`: a controlled mismatch, the rollout weights a perturbed copy (seeded by seed, step)."""
        if not self.opts.rollout_noise:
            return
        g = torch.Generator().manual_seed(stable_seed(self.seed, "noise", self.step))
        for p in model.parameters():
            if p.dim() >= 2:
                noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
                p.add_((noise * self.opts.rollout_noise * p.float().std()).to(p.dtype))

    def generate(self, problems, group_size: int, temperature: float, tag, first_row: int = 0, engine=None):
        """All problems × group_size samples -> (engine results per row, reward Samples); row i samples with the
        seed of row first_row + i (its index in the global batch). `engine`: the rollout engine by default."""
        rows_of = [p for p in problems for _ in range(group_size)]
        prompts, media = [p.prompt_ids for p in rows_of], [p.meta.get("media") for p in rows_of]
        seeds = [stable_seed(self.seed, tag, first_row + i) for i in range(len(prompts))]
        o = self.opts
        routes = engine is None and o.routing_replay != "off"  # the trained rollouts' experts (replay.py)
        res = (engine or self.engine).generate(prompts, o.max_new_tokens, temperature=temperature, top_p=o.top_p,
                                               top_k=o.top_k, seeds=seeds, logprobs=True, stop_ids=self._stop_ids(),
                                               media=media if any(m is not None for m in media) else None,
                                               **({"return_routes": True} if routes else {}))  # fmt: skip
        if engine is None:
            self.check_versions(res.weight_versions)
        samples = reward_lib.samples_of([p.meta for p in rows_of], res, o.max_new_tokens, self.style)
        self.gen_stats = res.stats  # the engine's: new tokens and row slots (rollout_idle_frac)
        rows = [(prompts[i], res.tokens[i], res.logprobs[i], res.routes[i] if res.routes else None)
                for i in range(len(prompts))]  # fmt: skip
        return rows, samples

    def check_versions(self, reported: list | None) -> None:
        """The sampler's own weight versions (the policy reports one per row; a server its own) against the
        staleness bound `rl.tau` in trainer steps. A rollout older than that means the server did not take the
        pushed weights: an error, never silently off-policy data."""
        versions = [v if isinstance(v, int) else self.version for v in (reported or [None])]
        stale = [self.step - v for v in versions]
        self.staleness = (sum(stale) / len(stale), max(stale))
        if max(stale) > self.opts.tau:
            raise RuntimeError(f"rl: rollouts at step {self.step} came from weight version {min(versions)}, more than "
                               f"rl.tau={self.opts.tau} steps old (the last push was version {self.version}): the "
                               "rollout server did not take the pushed weights")  # fmt: skip

    def _stop_ids(self):
        if self.tokenizer is not None:
            return None
        return [self.opts.toy_stop_id]

    # ------------------------------------------------------------------ one step's batch
    def make_step(self) -> list[dict]:
        o = self.opts
        _, level, group, hard_k = map(int, stage_at(o.curriculum, self.step))
        W, rank = dist.world(), dist.rank()
        n_prompts = o.samples_per_step // group // W  # this rank's groups
        evaluate = bool(o.eval_every and -self.step % o.eval_every < self.updates)  # a multiple in this batch's steps
        stats = {"time/sync_s": self.sync(), "level": float(level), "group_size": float(group)}
        t0 = time.perf_counter()
        if evaluate:
            self.prepare_eval()
            stats |= self.heldout_scores()
            stats["heldout_acc_sampled"] = self.evaluate(self.temperature)  # at the rollout temperature
            stats |= self.mtp_acceptance()  # does the MTP layer still draft for this trunk (rl.mtp_weight)
        if o.dynamic_temperature and plateaued(self.history, o.plateau_window, o.plateau_tol):
            self.temperature = self.sweep_temperature()
            self.history = []
        stats["time/eval_s"] = time.perf_counter() - t0
        n_global = n_prompts * W  # groups in the global batch
        if o.partial_rollouts:  # over-sampled groups, stragglers kept for the next step (partial.py): this rank's
            return self.finish_step(self.partial_groups(n_global, group, level, stats), group, stats)
        kept, spare, t_roll, t_rew, n_groups, n_zero, new_tok, slots = [], [], 0.0, 0.0, 0, 0, 0, 0
        for round_ in range(1 + o.oversample_rounds):
            need = n_global - len(kept)
            if need <= 0:
                break
            # a global draw (round 0: the batch; then refills), each rank generating its contiguous share with the
            # seeds of the global rows; every rank then sees every group, in global order, as one process would
            ask = n_global if round_ == 0 else need * o.oversample
            share = -(-ask // W)
            problems = self.task.problems(split="train", n=share * W, seed=stable_seed(self.seed, self.step, round_),
                                          level=level)[rank * share : (rank + 1) * share]  # fmt: skip
            t0 = time.perf_counter()
            rows, samples = self.generate(problems, group, self.temperature, (self.step, round_), rank * share * group)
            t1 = time.perf_counter()
            rew, means = reward_lib.total(samples, self.weights)
            t_roll, t_rew = t_roll + t1 - t0, t_rew + time.perf_counter() - t1
            new_tok, slots = new_tok + sum(len(r[1]) for r in rows), slots + self.gen_stats.get("row_slots", 0)
            if round_ == 0:  # the policy's reward as sampled: first round only (no selection bias)
                stats |= dist.means_over_ranks(means | {
                    "reward": sum(rew) / len(rew),
                    "response_len": sum(len(r[1]) for r in rows) / len(rows),
                    "truncated_frac": sum(s.finish == "length" for s in samples) / len(samples),
                })  # fmt: skip
            mine = [[(rows[g * group + j], rew[g * group + j], samples[g * group + j]) for j in range(group)]
                    for g in range(len(problems))]  # fmt: skip
            for grp in (g for part in dist.gather_objects(mine) for g in part):
                values = [r for _, r, _ in grp]
                n_groups, n_zero = n_groups + 1, n_zero + int(len(set(values)) == 1)
                (kept if informative(values, hard_k) or not o.dynamic_sampling else spare).append(grp)
        kept = (kept + spare)[:n_global]  # not enough informative groups: fill with zero-gradient ones
        stats |= {"zero_var_frac": n_zero / max(n_groups, 1), "time/rollout_s": t_roll, "time/reward_s": t_rew,
                  "rollout_tok_per_s": new_tok / max(t_roll, 1e-9),
                  # rows decoded while finished (the long tail's cost; partial.py cuts it) and finished samples/s
                  "rollout_idle_frac": 1.0 - new_tok / slots if slots else 0.0,
                  "rollout_samples_per_s": n_global * group / W / max(t_roll, 1e-9)}  # fmt: skip
        return self.finish_step(kept[rank * n_prompts : (rank + 1) * n_prompts], group, stats)  # this rank's share

    def finish_step(self, kept: list, group: int, stats: dict) -> list[dict]:
        """The step's groups (this rank's share) -> the micro-batches of its updates, with the step's figures."""
        stats |= {"kept_informative": float(sum(len({r for _, r, _ in g}) > 1 for g in kept)) / max(len(kept), 1),
                  "temperature": self.temperature, "weight_version": float(self.version),
                  "staleness_mean": self.staleness[0], "staleness_max": float(self.staleness[1])}  # fmt: skip
        self.history.append(stats["reward"])
        mixed = ([], [], {})
        if self.mix is not None:  # sampled by the rollout policy, which holds this step's weights
            self.mix.temperature = self.temperature
            mixed = self.mix.samples(self.step, self.engine)
        self.step += self.updates
        batch = self.batch(kept, group, stats, extra=mixed[0])
        if mixed[0]:
            stats |= mixed[2] | self.mix.score(batch, batch["input_ids"].shape[0] - len(mixed[0]), mixed[1])
        return self.updates_of(batch, stats)

    def partial_groups(self, n_groups: int, group: int, level: int, stats: dict) -> list:
        """rl.partial_rollouts' groups for this step (partial.py) and their figures into `stats`."""
        from glmstack.posttrain.rl.partial import partial_step

        kept, figures = partial_step(self, n_groups, group, level, stable_seed)
        flat = [x for g in kept for x in g]
        rows, samples = [x[0] for x in flat], [x[2] for x in flat]
        stale = [self.step - min(row[4]) for row in rows]
        self.staleness = (sum(stale) / len(stale), max(stale))
        new_tokens = figures.pop("new_tokens", 0.0)
        stats |= dist.means_over_ranks(figures | {
            "reward": sum(x[1] for x in flat) / len(flat),
            "response_len": sum(len(r[1]) for r in rows) / len(rows),
            "truncated_frac": sum(s.finish == "length" for s in samples) / len(samples),
            "zero_var_frac": sum(len({x[1] for x in g}) == 1 for g in kept) / len(kept),
            "rollout_tok_per_s": new_tokens / max(figures["time/rollout_s"], 1e-9)})  # fmt: skip
        return kept

    def batch(self, groups: list, group: int, stats: dict, extra: list = ()) -> dict:
        """The rollout batch as tensors (posttrain/sample.py's collate), advantages per group; `extra` Samples (the
        teachers' rows) after the groups' rows, with advantage 0 of their own."""
        flat = [s for g in groups for s in g]
        rew = torch.tensor([r for _, r, _ in flat])
        adv = group_advantages(rew, group, std_normalize=self.opts.std_normalize)
        samples = [Sample.single_turn(row[0], row[1], row[2], versions=list(row[4]) if len(row) > 4 else [self.version],
                                      group=i // group, index=i % group, reward=float(r), meta=s.meta,
                                      media=s.meta.get("media"), routes=row[3])
                   for i, (row, r, s) in enumerate(flat)]  # fmt: skip
        out = collate(samples + list(extra), torch.cat([adv, torch.zeros(len(extra))]))
        self.media = [s.media for s in samples] if samples[0].media is not None else []
        out |= {"rewards": rew} if self.opts.loss == "ppo" else {}  # ppo.rollout_fields puts them at the last token
        return out | ({"row": torch.arange(len(samples))} if self.media else {})

    @torch.no_grad()
    def old_logprobs(self, batch: dict, groups: list[torch.Tensor]) -> torch.Tensor:
        """log π_θold of the targets from the TRAINER at the rollout weights (before any update of this batch),
        under the rollout's sampling transform (losses.token_logprobs); `(B, L)`, on the CPU like the batch. One
        forward per group of rows: the first update's micro-batches, so that its log-probs equal these bit for
        bit (its PPO KL is exactly 0, as slime checks)."""
        from glmstack.posttrain.policy import trainer_numerics

        device = next(dist.unwrap(self.policy).parameters()).device
        out = torch.zeros_like(batch["rollout_logp"])
        for idx in groups:
            routes = model_routes(self.opts.routing_replay, batch, idx, device)  # as rl_loss replays them
            with trainer_numerics(self.opts.true_on_policy, self.autocast, device):  # the loss's forward's numerics
                logits = self.policy(batch["input_ids"][idx].to(device), **routes).logits.float()
            out[idx] = token_logprobs(logits, batch["targets"][idx].to(device), self.temperature, self.opts.top_p,
                                      self.opts.top_k).cpu()  # fmt: skip
        return out

    def updates_of(self, batch: dict, stats: dict) -> list[dict]:
        """The micro-batches of every optimizer step of this rollout batch: `ppo_epochs` passes, each over
        `minibatches` steps of `micro_batches` equal micro-batches. One step, one pass: the rows in rollout order;
        else each pass in its own order (seeded by (seed, step, epoch)). The rollout figures go with the first step
        only, so a rollout batch counts once in the dashboard."""
        n, L = batch["input_ids"].shape
        per_step, first = n // self.opts.minibatches, self.step - self.updates
        per = per_step // self.micro_batches
        out = []
        for epoch in range(self.opts.ppo_epochs):
            order = torch.arange(n)
            if self.updates > 1:
                g = torch.Generator().manual_seed(stable_seed(self.seed, "epoch", first, epoch))
                order = torch.randperm(n, generator=g)
            if self.opts.loss == "ppo" and epoch == 0:  # π_old, the critic's values, KL-in-reward, GAE (ppo.py)
                fields, figures = rollout_fields(self.policy, self.reference, batch, list(order.split(per)),
                                                 self.temperature, self.opts)  # fmt: skip
                batch, stats = batch | fields, stats | figures
            elif self.updates > 1 and epoch == 0:
                batch["old_logp"] = self.old_logprobs(batch, list(order.split(per)))
            for m in range(self.opts.minibatches):
                rows = order[m * per_step : (m + 1) * per_step]
                step_stats = stats if not out else {"temperature": self.temperature}
                step_stats = step_stats | {
                    "input_tokens": float(len(rows) * L),
                    "trained_tokens": float(batch["mask"][rows].sum()),
                    "ppo_epoch": epoch,
                }
                for k in range(0, per * self.micro_batches, per):
                    idx = rows[k : k + per]
                    micro = {key: value[idx] for key, value in batch.items()}
                    out.append(self.with_pixels(self.trimmed(micro) | {"temperature": self.temperature,
                                                                       "stats": step_stats}))  # fmt: skip
        return out

    def trimmed(self, micro: dict) -> dict:
        """The micro-batch without its trailing columns past the last trained target: exact for a causal model
        (no trained position sees them; the reductions read the mask), and what keeps a batch that mixes short rows
        with long ones (a teacher's tool prompts, rl.teachers) from padding every micro-batch to the longest. Only
        with one update per batch: with several, π_old was computed in the untrimmed shapes (old_logprobs)."""
        if self.updates > 1 or self.media or self.opts.loss == "ppo":  # ppo: GAE's fields span the whole row
            return micro
        L = micro["mask"].shape[1]
        used = int(micro["mask"].any(0).nonzero().max()) + 1 if micro["mask"].any() else L
        if used == L:
            return micro
        return {k: v[:, :used] if torch.is_tensor(v) and v.dim() >= 2 and v.shape[1] == L else v
                for k, v in micro.items()}  # fmt: skip

    def with_pixels(self, micro: dict) -> dict:
        """A VL micro-batch gets the pixels of its rows, in row order (rl_loss passes them to the model)."""
        if "row" not in micro:
            return micro
        from glmstack.multimodal.processor import Media

        return micro | Media.concat([self.media[r] for r in micro.pop("row").tolist()]).model_inputs()

    # ------------------------------------------------------------------ held-out evaluation
    def heldout_scores(self, temperature: float = 0.0) -> dict[str, float]:
        """Held-out scores of the trainer's current weights (greedy by default; prepare_eval loads them) on one set
        of replies: `heldout_acc`, the task's own reward averaged, and — when the stage trains on other rewards
        (rl.rewards, e.g. a reward model) — `heldout_reward`, their weighted total averaged."""
        _, samples = self.generate(self.heldout, 1, temperature, ("heldout", self.step), engine=self.eval_engine)
        task_rewards = [(r, 1.0) for r in self.task.rewards]

        def mean(weights):
            return sum(reward_lib.total(samples, weights)[0]) / max(len(samples), 1)

        return {"heldout_acc": mean(task_rewards)} | ({} if self.weights == task_rewards else
                                                      {"heldout_reward": mean(self.weights)})  # fmt: skip

    def evaluate(self, temperature: float = 0.0) -> float:
        """Held-out accuracy (the task's reward) of the trainer's current weights."""
        return self.heldout_scores(temperature)["heldout_acc"]

    def mtp_acceptance(self, n: int = 32, k: int = 2) -> dict:
        """Greedy MTP speculative decoding (k drafts per verify step) of `n` held-out prompts with the evaluated
        weights: the mean accepted length per verify step, and the fraction of rows whose output equals plain greedy
        decoding (1: speculative decoding must not change the output). {} without an MTP layer or in-process engine."""
        pol = self.eval_engine
        if getattr(pol, "engine", None) is None or not pol.cfg.num_nextn_predict_layers or not self.heldout:
            return {}
        prompts = [p.prompt_ids for p in self.heldout[:n]]
        kw = {"max_new_tokens": self.opts.max_new_tokens, "temperature": 0.0, "stop_ids": self._stop_ids()}
        with torch.no_grad(), pol.numerics():
            plain = pol.engine.generate(prompts, **kw)
            spec = pol.engine.generate(prompts, speculative="mtp", draft_k=k, **kw)
        same = sum(a == b for a, b in zip(plain.tokens, spec.tokens)) / max(len(prompts), 1)
        return {"mtp_accept_len": float(spec.stats["mean_accepted_length"]), "spec_equals_greedy": same}

    def sweep_temperature(self) -> float:
        self.prepare_eval()
        scores = {t: self.evaluate(t) for t in self.opts.temperatures if t >= self.temperature}
        return pick_temperature(scores | {self.temperature: self.evaluate(self.temperature)})


def check_divisible(samples: int, group: int, micro_batches: int) -> str | None:
    if samples % group:
        return f"rl.samples_per_step={samples} is not a multiple of the group size {group}"
    if samples % micro_batches:
        return f"rl.samples_per_step={samples} does not split into grad_accum={micro_batches} micro-batches"
    return None
