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
`temperature`, `stats` (the dashboard's rollout figures). Every micro-batch of a step is padded to the same length
so the loop's per-micro-batch weights (by input tokens) are equal and a sample-mean reduction stays exact.
With PPO-style updates (`rl.ppo_epochs` × `rl.minibatches` optimizer steps per rollout batch) the batch also carries
`old_logp (B, L)`: the trainer's log-probs at the rollout weights, computed once before the first update; each epoch
visits the samples in a fresh order (a pure function of seed, step and epoch) cut into `minibatches` steps.

Everything is a pure function of (seed, step): the prompts, the per-row sampling seeds and the held-out set, so the
state (`state_dict`) is the step counter, the temperature, the reward history and the micro-batches of the current
rollout batch not yet trained on (PPO-style updates), and a resumed run generates exactly what the uninterrupted one
did (tests/posttrain/test_rl_stage.py).
"""

from __future__ import annotations

import copy
import time
import zlib

import torch

from glmstack.posttrain.rl import rewards as reward_lib
from glmstack.posttrain.rl.losses import group_advantages, token_logprobs
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

    def __init__(self, *, model, task, opts, seed: int, micro_batches: int, tokenizer=None, style="glm-4.5"):
        self.policy, self.task, self.opts, self.seed = model, task, opts, seed
        self.micro_batches, self.tokenizer, self.style = micro_batches, tokenizer, style
        self.weights = [tuple(w) for w in opts.rewards] or [(r, 1.0) for r in task.rewards]
        for name, _ in self.weights:
            reward_lib.get(name)
        self.step, self.temperature, self.history = 0, float(opts.temperature), []
        self.queue: list[dict] = []
        self.engine = None
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
                "queue": list(self.queue)}  # fmt: skip

    def load_state_dict(self, state: dict) -> None:
        self.step, self.temperature = int(state["step"]), float(state["temperature"])
        self.history, self.queue = list(state["history"]), list(state.get("queue", []))

    @property
    def updates(self) -> int:
        """Optimizer steps per rollout batch."""
        return self.opts.ppo_epochs * self.opts.minibatches

    # ------------------------------------------------------------------ the rollout engine
    def sync(self, perturb: bool = True) -> float:
        """Copy the trainer's weights into the rollout model (made on first use, in `rl.rollout_dtype`); `perturb`:
        then add `rl.rollout_noise` (held-out evaluation syncs without it: it scores the trained weights)."""
        from glmstack.inference import Engine

        t0 = time.perf_counter()
        policy = dist.unwrap(self.policy)
        if self.opts.rollout_server:  # the server keeps its weights (remote.py)
            if self.engine is None:
                from glmstack.posttrain.rl.remote import ServerEngine

                self.engine = ServerEngine(self.opts.rollout_server, self.opts.server_model, self.tokenizer,
                                           api_key=self.opts.rollout_server_key or None)  # fmt: skip
            return 0.0
        if self.engine is None:
            rollout_model = copy.deepcopy(policy).to(getattr(torch, self.opts.rollout_dtype))
            self.engine = Engine(rollout_model, self.tokenizer)
            self.engine.compact = True
        with torch.no_grad():
            self.engine.model.load_state_dict(policy.state_dict())
            if self.opts.rollout_noise and perturb:  # a controlled mismatch: the rollout weights are a perturbed copy
                g = torch.Generator().manual_seed(stable_seed(self.seed, "noise", self.step))
                for p in self.engine.model.parameters():
                    if p.dim() >= 2:
                        noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
                        p.add_((noise * self.opts.rollout_noise * p.float().std()).to(p.dtype))
        return time.perf_counter() - t0

    def generate(self, problems, group_size: int, temperature: float, tag) -> tuple[list, list[reward_lib.Sample]]:
        """All problems × group_size samples -> (engine results per row, reward Samples)."""
        prompts = [p.prompt_ids for p in problems for _ in range(group_size)]
        seeds = [stable_seed(self.seed, tag, i) for i in range(len(prompts))]
        o = self.opts
        res = self.engine.generate(prompts, max_new_tokens=o.max_new_tokens, temperature=temperature, top_p=o.top_p,
                                   top_k=o.top_k, seeds=seeds, logprobs=True, stop_ids=self._stop_ids())  # fmt: skip
        samples = []
        for i, toks in enumerate(res.tokens):
            text = res.text[i] if res.text is not None else ""
            samples.append(reward_lib.Sample(meta=problems[i // group_size].meta, tokens=toks, text=text,
                                             finish=res.finish_reason[i], max_new_tokens=o.max_new_tokens,
                                             style=self.style))  # fmt: skip
        rows = [(prompts[i], res.tokens[i], res.logprobs[i]) for i in range(len(prompts))]
        return rows, samples

    def _stop_ids(self):
        if self.tokenizer is not None:
            return None
        return [self.opts.toy_stop_id]

    # ------------------------------------------------------------------ one step's batch
    def make_step(self) -> list[dict]:
        o = self.opts
        _, level, group, hard_k = map(int, stage_at(o.curriculum, self.step))
        n_prompts = o.samples_per_step // group
        evaluate = bool(o.eval_every and -self.step % o.eval_every < self.updates)  # a multiple in this batch's steps
        stats = {"time/sync_s": self.sync(perturb=not evaluate), "level": float(level), "group_size": float(group)}
        t0 = time.perf_counter()
        if evaluate:
            stats["heldout_acc"] = self.evaluate()
            stats["heldout_acc_sampled"] = self.evaluate(self.temperature)  # at the rollout temperature
        if o.dynamic_temperature and plateaued(self.history, o.plateau_window, o.plateau_tol):
            self.temperature = self.sweep_temperature()
            self.history = []
        stats["time/eval_s"] = time.perf_counter() - t0
        if evaluate and o.rollout_noise:
            stats["time/sync_s"] += self.sync()
        kept, spare, t_roll, t_rew, n_groups, n_zero, new_tok = [], [], 0.0, 0.0, 0, 0, 0
        for round_ in range(1 + o.oversample_rounds):
            need = n_prompts - len(kept)
            if need <= 0:
                break
            ask = need if round_ == 0 else need * o.oversample
            tag = (self.step, round_) if dist.world() == 1 else (self.step, round_, dist.rank())  # ranks differ
            problems = self.task.problems(split="train", n=ask, seed=stable_seed(self.seed, *tag), level=level)
            t0 = time.perf_counter()
            rows, samples = self.generate(problems, group, self.temperature, tag)
            t1 = time.perf_counter()
            rew, means = reward_lib.total(samples, self.weights)
            t_roll, t_rew = t_roll + t1 - t0, t_rew + time.perf_counter() - t1
            new_tok += sum(len(r[1]) for r in rows)
            if round_ == 0:  # the policy's reward as sampled: first round only (no selection bias)
                stats |= means | {
                    "reward": sum(rew) / len(rew),
                    "response_len": sum(len(r[1]) for r in rows) / len(rows),
                    "truncated_frac": sum(s.finish == "length" for s in samples) / len(samples),
                }
            for g in range(len(problems)):
                grp = [(rows[g * group + j], rew[g * group + j], samples[g * group + j]) for j in range(group)]
                values = [r for _, r, _ in grp]
                n_groups, n_zero = n_groups + 1, n_zero + int(len(set(values)) == 1)
                (kept if informative(values, hard_k) or not o.dynamic_sampling else spare).append(grp)
        kept = (kept + spare)[:n_prompts]  # not enough informative groups: fill with zero-gradient ones
        stats |= {"zero_var_frac": n_zero / max(n_groups, 1), "kept_informative": float(sum(
            len({r for _, r, _ in g}) > 1 for g in kept)) / n_prompts,
            "time/rollout_s": t_roll, "time/reward_s": t_rew, "rollout_tok_per_s": new_tok / max(t_roll, 1e-9),
            "temperature": self.temperature}  # fmt: skip
        self.history.append(stats["reward"])
        self.step += self.updates
        return self.updates_of(self.batch(kept, group, stats), stats)

    def batch(self, groups: list, group: int, stats: dict) -> dict:
        """The rollout batch as tensors: the samples padded to one length, advantages per group."""
        flat = [s for g in groups for s in g]
        rew = torch.tensor([r for _, r, _ in flat])
        adv = group_advantages(rew, group, std_normalize=self.opts.std_normalize)
        L = max(len(p) + len(t) for (p, t, _), _, _ in flat) - 1
        n = len(flat)
        ids, tgt = torch.zeros(n, L, dtype=torch.long), torch.zeros(n, L, dtype=torch.long)
        mask, rlp = torch.zeros(n, L), torch.zeros(n, L)
        for i, ((prompt, toks, lps), _, _) in enumerate(flat):
            seq = prompt + toks
            ids[i, : len(seq) - 1] = torch.tensor(seq[:-1])
            tgt[i, : len(seq) - 1] = torch.tensor(seq[1:])
            lo, hi = len(prompt) - 1, len(seq) - 1
            mask[i, lo:hi] = 1.0
            rlp[i, lo:hi] = torch.tensor(lps, dtype=torch.float32)
        out = {"input_ids": ids, "targets": tgt, "mask": mask, "rollout_logp": rlp, "advantages": adv}
        if self.updates > 1:
            out["old_logp"] = self.old_logprobs(ids, tgt)
        return out

    @torch.no_grad()
    def old_logprobs(self, ids, tgt, chunk: int = 64):
        """log π_θold of the targets from the TRAINER at the rollout weights (before any update of this batch),
        under the rollout's sampling transform (losses.token_logprobs); `(B, L)`, on the CPU like the batch."""
        device = next(dist.unwrap(self.policy).parameters()).device
        parts = []
        for k in range(0, len(ids), chunk):
            logits = self.policy(ids[k : k + chunk].to(device)).logits.float()
            lp = token_logprobs(logits, tgt[k : k + chunk].to(device), self.temperature, self.opts.top_p,
                                self.opts.top_k)  # fmt: skip
            parts.append(lp.cpu())
        return torch.cat(parts)

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
                    out.append({key: value[idx] for key, value in batch.items()}
                               | {"temperature": self.temperature, "stats": step_stats})  # fmt: skip
        return out

    # ------------------------------------------------------------------ held-out evaluation
    def evaluate(self, temperature: float = 0.0, n: int | None = None) -> float:
        """Held-out accuracy of the rollout weights (greedy by default): the task reward averaged."""
        problems = self.heldout[: n or len(self.heldout)]
        _, samples = self.generate(problems, 1, temperature, ("heldout", self.step))
        task_rewards = [(r, 1.0) for r in self.task.rewards]
        rew, _ = reward_lib.total(samples, task_rewards)
        return sum(rew) / max(len(rew), 1)

    def sweep_temperature(self) -> float:
        scores = {t: self.evaluate(t) for t in self.opts.temperatures if t >= self.temperature}
        return pick_temperature(scores | {self.temperature: self.evaluate(self.temperature)})


def check_divisible(samples: int, group: int, micro_batches: int) -> str | None:
    if samples % group:
        return f"rl.samples_per_step={samples} is not a multiple of the group size {group}"
    if samples % micro_batches:
        return f"rl.samples_per_step={samples} does not split into grad_accum={micro_batches} micro-batches"
    return None
