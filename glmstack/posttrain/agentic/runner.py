"""The asynchronous rollout runner: workers generate continuously, the trainer takes batches as they accumulate.

GLM-5 §3.3 (research/rl-recipe.md §1.3): the inference side never waits for the trainer; a batch trains once
enough trajectories have accumulated; weights go to the workers every K updates (data.py pushes them, the version
being the trainer step they come from); each sample records its weight versions and is dropped when the trainer's
current step s − its first version w0 > tau: staleness counts trainer steps, so the K − 1 steps between pushes
count too.

    runner = Runner(pool, sample, groups_per_step=2, group_size=8, tau=1, workers=2, inflight=2)
    runner.push(state_dict, version=0)
    groups, stats = runner.next_batch(step=3)    # blocks until groups_per_step groups are ready

Tasks get increasing ids; each id is one group (one spec × group_size episodes with seeds from the id). With
several trainer ranks each runner takes its own ids: local id i is task i · world + rank everywhere outside the
runner (spec, seeds, what the pool reports), so no two ranks train the same trajectories. The ledger
records what became of every id exactly once (trained | stale | dropped | flat), so a result that arrives twice (a task
re-done after its worker died) is never counted twice, and none is lost: ids are handed to the trainer in order
(a reorder buffer), so the batches of a run are a function of the weights each task saw, not of which worker
finished first. `asynchronous=True` keeps `workers × inflight` tasks queued at all times (the workers generate
while the trainer trains); False submits only the tasks the next batch needs, after the weights were pushed —
the synchronous baseline, with the same code. `out_of_order=True` (agentic.partial_rollouts) gives up that order
for the long tail: the oldest finished groups are handed over, a long episode keeps running on its worker (its later
turns on newer weights, each turn's version recorded) and trains at a later step if within tau, else is dropped;
`oversample` o keeps ceil(missing × (1 + o)) groups outstanding, so even the synchronous runner trains the first
groups to finish and carries the rest over (APRIL's over-sampling, without aborts: a multi-turn episode continues).
The pool's `busy_s` (seconds its workers spent inside rollouts) gives the workers' idle fraction.
`max_looked` > 0 (agentic.dynamic_sampling, DAPO's filter): a group whose rewards are all equal (advantage 0, no
gradient) is set aside (ledger "flat") and more tasks are generated, until the batch holds `groups_per_step`
informative groups or `max_looked` groups were looked at for it; then set-aside groups fill the rest.
"""

from __future__ import annotations

import math
import time
from collections import Counter

from glmstack.posttrain.agentic.groups import settle


class Runner:
    def __init__(self, pool, sample, *, groups_per_step: int, group_size: int, tau: int, workers: int,
                 inflight: int = 1, asynchronous: bool = True, rank: int = 0, world: int = 1,
                 out_of_order: bool = False, oversample: float = 0.0, max_looked: int = 0):  # fmt: skip
        self.pool, self.sample = pool, sample  # sample(task_id) -> spec
        self.rank, self.world = rank, world
        self.groups_per_step, self.group_size, self.tau = groups_per_step, group_size, tau
        self.workers, self.inflight, self.asynchronous = workers, inflight, asynchronous
        # agentic.partial_rollouts: hand over finished groups in any order, so a long episode does not hold its batch
        # (it keeps running on its worker, later turns on newer weights, and trains at a later step if within tau)
        self.out_of_order, self.oversample = out_of_order, oversample
        self.max_looked = max_looked  # agentic.dynamic_sampling: groups looked at per batch at most; 0 = off
        self.version = -1
        self.next_id = 0  # next task id to submit
        self.take = 0  # next task id to hand to the trainer
        self.results: dict[int, list] = {}  # finished, not yet handed over
        self.owner: dict[int, int] = {}  # outstanding task id -> worker
        self.ledger: dict[int, str] = {}  # task id -> trained | stale | dropped
        self.trained_ids: list[int] = []  # task ids handed to the trainer, in order
        self.duplicates = 0
        self.trajectories = 0  # accepted (trained) trajectories, padding excluded

    def push(self, state: dict, version: int) -> None:
        self.pool.set_weights(state, version)
        self.version = version

    def _submit_one(self) -> None:
        while self.next_id in self.ledger:  # handed over before a resume (out of order): not generated again
            self.next_id += 1
        load = Counter(self.owner.values())
        w = min(range(self.workers), key=lambda k: load[k])
        self.owner[self.next_id] = w
        task = self.next_id * self.world + self.rank  # the global task id: disjoint over ranks
        self.pool.submit(w, task, self.sample(task), max(self.version, 0))  # not before the last push
        self.next_id += 1

    def _top_up(self, missing: int) -> None:
        if self.out_of_order:  # outstanding work, whatever ids it has: what the batch needs, over-sampled (+ queues)
            want = max(math.ceil(missing * (1 + self.oversample)) - len(self.results), 0)
            want += self.workers * self.inflight if self.asynchronous else 0
            while len(self.owner) < want:
                self._submit_one()
            return
        target = self.take + missing  # sync: just what the next batch still needs
        if self.asynchronous:
            target = max(target, self.take + len(self.results) + self.workers * self.inflight)
        while self.next_id < target:
            self._submit_one()

    def _next_ready(self) -> int | None:
        """The id to hand over next: `take` (in order), or with out_of_order the oldest finished one."""
        if self.take in self.results:
            return self.take
        return min(self.results) if self.out_of_order and self.results else None

    def _collect(self) -> None:
        for task, group in self.pool.wait():
            task_id, rank = divmod(task, self.world)
            if rank != self.rank or task_id in self.ledger or task_id in self.results or task_id not in self.owner:
                self.duplicates += 1
                continue
            del self.owner[task_id]
            self.results[task_id] = group

    def next_batch(self, step: int | None = None) -> tuple[list[list], dict]:
        """The next `groups_per_step` groups for trainer step `step` (default: the last pushed version), staleness
        measured against it."""
        t0, current = time.perf_counter(), self.version if step is None else step
        groups, why, flat, looked = [], Counter(), [], 0
        while len(groups) < self.groups_per_step:
            if self.max_looked and looked >= self.max_looked and flat:  # enough looked at: flat groups fill
                self._accept(groups, *flat.pop(0))
                continue
            task_id = self._next_ready()
            if task_id is not None:
                group = self.results.pop(task_id)
                kept, reasons = settle(group, self.group_size, current, self.tau)
                why.update(reasons)
                looked += kept is not None
                if kept and self.max_looked and len({t.reward for t in kept}) == 1:
                    self.ledger[task_id] = "flat"  # set aside: trained only if the batch cannot fill otherwise
                    flat.append((task_id, kept, reasons["padded"]))
                    why["flat_groups"] += 1
                elif kept:
                    self._accept(groups, task_id, kept, reasons["padded"])
                else:
                    self.ledger[task_id] = "stale" if reasons["stale"] else "dropped"
                while self.take in self.ledger:  # past every id handed over (out of order: some were earlier)
                    self.take += 1
                continue
            self._top_up(self.groups_per_step - len(groups))
            self._collect()
        if self.asynchronous:
            self._top_up(0)  # keep the workers busy while the trainer trains
        staleness = [current - t.first_version for g in groups for t in g]
        stats = {f"rollout/{k}": float(v) for k, v in why.items()} | {
            "time/wait_s": time.perf_counter() - t0, "staleness_mean": sum(staleness) / len(staleness),
            "staleness_max": float(max(staleness)), "rollout/restarts": float(self.pool.restarts),
            "rollout/duplicates": float(self.duplicates), "rollout/worker_busy_s": float(self.pool.busy_s),
            "rollout/carried_groups": float(len(self.owner) + len(self.results))}  # fmt: skip
        return groups, stats

    def _accept(self, groups: list, task_id: int, group: list, padded: int) -> None:
        self.ledger[task_id] = "trained"
        groups.append(group)
        self.trained_ids.append(task_id)
        self.trajectories += self.group_size - padded

    def close(self) -> None:
        self.pool.close()
