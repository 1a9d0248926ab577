"""Where rollout workers live: in this process (`runner=local`) or as Ray actors (`runner=ray`), one interface.

    pool.submit(w, task_id, spec, v)   queue a group on worker w, its first turn on weights of version >= v
    pool.wait() -> [(task_id, group)]  finished tasks (at least one)
    pool.set_weights(state, version)   every worker (Ray: one object-store copy, staged between turns)

LocalPool runs a queued task when `wait` is called (one process, no concurrency: with tau = 0 it is the
synchronous loop). RayPool keeps one actor per worker (`num_cpus=1` each) whose rollouts run back to back while
the trainer trains; `set_weights` uses its own concurrency group so it lands mid-task, between turns. A dead
actor (killed, crashed, OOM-killed by Ray's memory monitor) shows up as an error on its pending results: `wait` starts a fresh
actor in its place with the latest weights and re-submits each of its lost tasks to it (same task id, same seeds);
`restarts` and `resubmitted` count them. The runner's ledger (runner.py) accepts each task id once.
"""

from __future__ import annotations

import copy
import time
from collections import deque

from glmstack.posttrain.agentic.worker import RolloutWorker
from glmstack.posttrain.policy import make_policy


class LocalPool:
    def __init__(self, model, tokenizer_dir: str, opts, env_opts, seed: int, workers: int, group_size: int,
                 server: tuple | None = None, weights_dir: str = "", numerics: tuple = (False, None)):  # fmt: skip
        self.args = (tokenizer_dir, opts, env_opts, seed)
        self.numerics = numerics  # RolloutWorker's: agentic.true_on_policy
        self.model, self.group_size, self.server_args = model, group_size, server
        self.server = make_policy(None, server=server, weights_dir=weights_dir) if server else None
        self.workers = [self._make() for _ in range(workers)]
        self.queue: deque = deque()
        self.restarts = self.resubmitted = 0  # in-process workers do not die
        self.busy_s = 0.0  # seconds the workers spent inside rollouts (their idle fraction: runner.py)

    def _make(self) -> RolloutWorker:
        model = None if self.server else copy.deepcopy(self.model)
        return RolloutWorker(model, *self.args, server=self.server_args, numerics=self.numerics)

    def submit(self, w: int, task_id: int, spec: dict, min_version: int = 0) -> None:
        self.queue.append((w, task_id, spec, min_version))

    def wait(self) -> list[tuple[int, list]]:
        w, task_id, spec, min_version = self.queue.popleft()
        group, seconds = timed_rollout(self.workers[w], task_id, spec, self.group_size, min_version)
        self.busy_s += seconds
        return [(task_id, group)]

    def set_weights(self, state: dict, version: int) -> None:
        state = push_to_server(self.server, state, version)
        for w in self.workers:
            w.set_weights(state, version)

    def pending(self) -> int:
        return len(self.queue)

    def close(self) -> None:
        self.queue.clear()
        if self.server is not None:
            self.server.close()


def timed_rollout(worker: RolloutWorker, task_id: int, spec: dict, group_size: int, min_version: int) -> tuple:
    """(the group, the seconds the worker spent on it: generation and tool calls alike, not the wait for weights)."""
    worker.wait_for(min_version)
    t0 = time.perf_counter()
    return worker.rollout(task_id, spec, group_size, min_version=min_version), time.perf_counter() - t0


def push_to_server(server, state: dict, version: int) -> dict | None:
    """What the workers get: the state itself, or None when the rollout server took it (they learn the version)."""
    if server is None:
        return state
    server.push(state, version)
    return None


def ray_worker_class():
    import ray

    @ray.remote(num_cpus=1, concurrency_groups={"control": 1, "rollout": 1})
    class RayRolloutWorker:
        def __init__(self, model, *args):
            self.w = RolloutWorker(model, *args)

        @ray.method(concurrency_group="control")
        def set_weights(self, state, version):
            self.w.set_weights(state, version)

        @ray.method(concurrency_group="control")
        def pid(self):
            return self.w.pid()

        @ray.method(concurrency_group="rollout")
        def rollout(self, task_id, spec, group_size, min_version):
            return timed_rollout(self.w, task_id, spec, group_size, min_version)

    return RayRolloutWorker


class RayPool:
    def __init__(self, model, tokenizer_dir: str, opts, env_opts, seed: int, workers: int, group_size: int,
                 address: str = "", num_cpus: int = 0, threads: int = 1,
                 server: tuple | None = None, weights_dir: str = "", numerics: tuple = (False, None)):  # fmt: skip
        import ray

        if not ray.is_initialized():
            kw = {"address": address} if address else {"num_cpus": num_cpus or None}
            ray.init(**kw, include_dashboard=False, log_to_driver=False, configure_logging=False)
        self.ray = ray
        self.cls = ray_worker_class()
        self.model_ref = ray.put(None if server else copy.deepcopy(model).cpu())
        self.args = (tokenizer_dir, opts, env_opts, seed, threads, server, numerics)
        self.server = make_policy(None, server=server, weights_dir=weights_dir) if server else None
        self.group_size = group_size
        self.actors = [self._make() for _ in range(workers)]
        self.refs: dict = {}  # ObjectRef -> (worker, task_id, spec, min_version, actor)
        self.weights: tuple | None = None  # (object ref, version) of the latest push
        self.restarts = self.resubmitted = 0
        self.busy_s = 0.0  # seconds the actors spent inside rollouts, summed as their results arrive
        errors = ray.exceptions
        self._died = (errors.RayActorError, errors.WorkerCrashedError, errors.OutOfMemoryError)

    def _make(self):
        return self.cls.remote(self.model_ref, *self.args)

    def submit(self, w: int, task_id: int, spec: dict, min_version: int = 0) -> None:
        actor = self.actors[w]
        ref = actor.rollout.remote(task_id, spec, self.group_size, min_version)
        self.refs[ref] = (w, task_id, spec, min_version, actor)

    def wait(self) -> list[tuple[int, list]]:
        out = []
        while not out:
            done, _ = self.ray.wait(list(self.refs), num_returns=1)
            for ref in done:
                w, task_id, spec, min_version, actor = self.refs.pop(ref)
                try:
                    group, seconds = self.ray.get(ref)
                    out.append((task_id, group))
                    self.busy_s += seconds
                except self._died:  # the worker died (killed, crashed, OOM-killed): a fresh one redoes its tasks
                    if actor is self.actors[w]:
                        self._restart(w)
                    self.submit(w, task_id, spec, min_version)
                    self.resubmitted += 1
        return out

    def _restart(self, w: int) -> None:
        self.ray.kill(self.actors[w], no_restart=True)
        self.actors[w] = self._make()
        self.restarts += 1
        if self.weights is not None:
            self.actors[w].set_weights.remote(*self.weights)

    def set_weights(self, state: dict, version: int) -> None:
        state = push_to_server(self.server, state, version)
        self.weights = (self.ray.put(state), version)
        for a in self.actors:
            a.set_weights.remote(*self.weights)

    def kill(self, w: int) -> None:
        """End worker w's process as a crash would (tests): its pending tasks fail with RayActorError."""
        self.ray.kill(self.actors[w], no_restart=True)

    def pid(self, w: int) -> int:
        return self.ray.get(self.actors[w].pid.remote())

    def pending(self) -> int:
        return len(self.refs)

    def close(self) -> None:
        for a in self.actors:
            self.ray.kill(a, no_restart=True)
        self.refs.clear()
        if self.server is not None:
            self.server.close()
