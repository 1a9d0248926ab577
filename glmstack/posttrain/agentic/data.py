"""The agentic RL data stream for the one loop: weight pushes, optimizer resets and micro-batches of trajectories.

The loop (glmstack/train/loop.py) asks for `grad_accum` micro-batches per optimizer step; `AgenticData` answers the
first request of step s by
  1. every K = `sync_every` steps: pushing the policy's weights to the rollout workers as version s, and resetting
     the optimizer's state (GLM-5 §3.3: "resets the optimizer after each inference-engine weight update");
  2. taking the next batch of groups from the runner (the staleness drop and failure rules apply there, staleness
     in trainer steps: step s − the step whose weights generated the sample's first turn);
  3. advantage = reward − group mean; the trajectories as posttrain/sample.py's `Sample`s through its `collate` (the
     one layout every RL path shares: `mask` 1 on the model's own tokens only, `rollout_logp` the engine's
     log-probs of those tokens), cut into equal micro-batches with `temperature` and `stats`.
The loss is the reasoning stage's (`rl.stage.rl_loss`) with `loss=dis`: GLM-5's direct double-sided importance
sampling against the rollout log-probs, no θ_old recompute.
"""

from __future__ import annotations

import time

import torch

from glmstack.posttrain.agentic.groups import advantages
from glmstack.posttrain.policy import full_state, served_state
from glmstack.posttrain.sample import collate


def reset_optimizer(optimizer) -> None:
    """Drop every optimizer's per-parameter state (moments, momentum); hyper-parameters stay."""
    for opt in getattr(optimizer, "optimizers", {"_": optimizer}).values():
        opt.state.clear()


class AgenticData:
    def __init__(self, *, policy, optimizer, runner, group_size: int, micro_batches: int, sync_every: int,
                 temperature: float, reset: bool = True, evaluate=None, eval_every: int = 0,
                 to_server: str = "", mix=None):  # fmt: skip
        self.policy, self.optimizer, self.runner = policy, optimizer, runner
        self.mix = mix  # rl/teachers.py's TeacherMix: cross-stage distillation rows in every batch, or None
        self.to_server = to_server  # pushes go to a rollout server: a LoRA policy's "adapter"s or "merged" weights
        self.group_size, self.micro_batches, self.sync_every = group_size, micro_batches, sync_every
        self.temperature, self.reset, self.evaluate, self.eval_every = temperature, reset, evaluate, eval_every
        self.step = 0
        self.last_groups: list = []
        self.t_last, self.busy_last = time.perf_counter(), 0.0

    def __iter__(self):
        while True:
            yield from self.make_step()

    def state_dict(self) -> dict:
        handed = sorted(i for i in self.runner.ledger if i >= self.runner.take)  # out of order: beyond `take`
        return {"step": self.step, "next_task": self.runner.take, "handed": handed,  # the summary's counts too:
                "trained": list(self.runner.trained_ids), "trajectories": self.runner.trajectories}  # fmt: skip

    def load_state_dict(self, state: dict) -> None:
        """Resume the counters: the step and the next task id (in-flight rollouts of the interrupted run are not
        saved; they are generated afresh from the resumed weights, so an asynchronous resume is not bit-exact)."""
        self.step = int(state["step"])
        self.runner.take = self.runner.next_id = int(state.get("next_task", 0))
        self.runner.ledger.update({int(i): "trained" for i in state.get("handed", [])})  # not generated again
        self.runner.trained_ids = [int(i) for i in state.get("trained", [])]
        self.runner.trajectories = int(state.get("trajectories", 0))

    def weights(self) -> dict:
        """The policy's whole state, a copy (collective with several ranks: FSDP / expert shards gathered)."""
        return full_state(self.policy)

    def make_step(self) -> list[dict]:
        stats = {}
        if self.step % self.sync_every == 0 or self.runner.version < 0:
            t0 = time.perf_counter()
            state = self.weights()
            self.runner.push(served_state(self.policy, state, self.to_server) if self.to_server else state, self.step)
            if self.mix is not None:
                self.mix.push(self.policy, state, self.step)
            if self.reset and self.step > 0:
                reset_optimizer(self.optimizer)
            stats["time/sync_s"] = time.perf_counter() - t0
        if self.evaluate is not None and self.eval_every and self.step % self.eval_every == 0:
            t0 = time.perf_counter()
            stats |= self.evaluate(self.weights())
            stats["time/eval_s"] = time.perf_counter() - t0
        groups, rstats = self.runner.next_batch(self.step)
        self.last_groups = groups  # the step's trajectories (tests, inspection)
        now = time.perf_counter()
        flat = [t for g in groups for t in g]
        stats |= rstats | rollout_stats(flat) | {
            "weight_version": float(self.runner.version), "accepted_trajectories": float(self.runner.trajectories),
            "traj_per_s": len(flat) / max(now - self.t_last, 1e-9),
            # the share of the workers' time since the last batch spent outside rollouts (a task's time counts when
            # its result arrives, so one step's figure is noisy; a run's sum is exact)
            "rollout/worker_idle_frac": 1 - (rstats["rollout/worker_busy_s"] - self.busy_last)
            / max(self.runner.workers * (now - self.t_last), 1e-9)}  # fmt: skip
        self.t_last, self.busy_last = now, rstats["rollout/worker_busy_s"]
        mixed = self.mix.samples(self.step) if self.mix is not None else ([], [], {})
        self.step += 1
        return self.micro(flat, stats, mixed)

    def micro(self, flat: list, stats: dict, mixed: tuple = ([], [], {})) -> list[dict]:
        """`mixed`: the teachers' (samples, owners, stats), rows after the trajectories', advantage 0 of their own."""
        extra, owners, mix_stats = mixed
        adv = advantages([t.reward for t in flat], self.group_size)
        batch = collate([t.sample() for t in flat] + extra, torch.cat([adv, torch.zeros(len(extra))]))
        if extra:
            mix_stats = mix_stats | self.mix.score(batch, len(flat), owners)
        n = len(flat) + len(extra)
        stats = stats | mix_stats | {
            "input_tokens": float(batch["input_ids"].numel()),
            "trained_tokens": float(batch["mask"].sum()),
            "zero_var_frac": zero_var_frac([t.reward for t in flat], self.group_size),
        }
        per = n // self.micro_batches
        return [{k: v[i : i + per] for k, v in batch.items()} | {"temperature": self.temperature, "stats": stats}
                for i in range(0, per * self.micro_batches, per)]  # fmt: skip


def zero_var_frac(rewards: list[float], group_size: int) -> float:
    """The share of groups whose rewards are all equal: their advantages are 0, so they teach nothing (a step where
    it is 1 moves the weights only through the teachers' rows and the optimizer's momentum)."""
    groups = [rewards[i : i + group_size] for i in range(0, len(rewards), group_size)]
    return sum(len(set(g)) == 1 for g in groups) / max(len(groups), 1)


def retry_stats(trajs: list) -> dict:
    """`retry_frac`: of the episodes with a failed tool call, the share that called again (absent when none
    failed) — what fault-injected training should raise (docs/agentic.md, session 6)."""
    failed = [t.retried for t in trajs if t.retried is not None]
    return {"retry_frac": sum(failed) / len(failed)} if failed else {}


def rollout_stats(flat: list) -> dict:
    n = max(len(flat), 1)
    status = lambda s: sum(t.status == s for t in flat) / n
    return retry_stats(flat) | {"reward": sum(t.reward for t in flat) / n, "success": sum(t.success for t in flat) / n,
            "turns": sum(t.turns for t in flat) / n, "model_tokens": sum(t.model_tokens for t in flat) / n,
            "malformed_frac": status("malformed"), "loop_frac": status("loop"), "truncated_frac": status("truncated"),
            "tool_calls": sum(len([m for m in t.messages if m["role"] == "tool"]) for t in flat) / n,
            "context_folds": sum(len(t.view.folds) if t.view else 0 for t in flat) / n,  # context management
            "segments": sum(len(t.segments) for t in flat) / n}  # fmt: skip
