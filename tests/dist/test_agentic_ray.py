"""The asynchronous agentic runner on a real local Ray cluster (issue 18): with tau = 0 and K = 1 the first
optimizer step (its batch with non-zero advantages, loss, gradients, updated weights) equals the synchronous
in-process run's bit for bit; under a deliberately slow trainer no trained sample is more
than tau versions old (and the rule did drop some); a rollout worker killed mid-run is restarted and the run
finishes with every task id accounted for exactly once (none lost, none trained twice); rollout actors generating on
our server (remote rollouts) give the in-process run's steps."""

from __future__ import annotations

import json
import math
import time

import pytest
import torch

from glmstack.posttrain.agentic.stage import build
from glmstack.recipes.agentic_tiny import agentic as tiny
from glmstack.train.stage import model_and_optimizer
from tests.posttrain.base import make_base
from tests.posttrain.test_agentic_server import assert_same_rollouts, train_recording, two_steps
from tests.serve_fixture import RunningServer

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.dist, pytest.mark.slow]
KEYS = ("input_ids", "targets", "mask", "rollout_logp", "advantages")
COIN = "tests.posttrain.agentic_coin:CoinEnv"  # mixed rewards from the episode seeds (a random model solves nothing)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return make_base(tmp_path_factory.mktemp("agentic_base") / "base")


def data_for(tmp_path, base, runner="ray", **agentic):
    cfg = tiny()
    cfg.out_dir, cfg.init_from, cfg.runner = str(tmp_path), str(base), runner
    cfg.agentic.envs = [["roles", 1.0]]
    for k, v in agentic.items():
        setattr(cfg.agentic, k, v)
    model, optimizer = model_and_optimizer(cfg)
    return cfg, model, optimizer, build(cfg, model, optimizer, str(base))


def first_update(folder, base, runner: str, asynchronous: bool) -> dict:
    """One optimizer step of the real loop on the coin environment (mixed rewards from the episode seeds): the
    batch the loss saw, the accumulated gradient of every parameter, the logged row and the updated weights."""
    cfg, model, optimizer, data = data_for(folder, base, runner, envs=[[COIN, 1.0]], tau=0, sync_every=1,
                                           asynchronous=asynchronous, workers=2, inflight=2)  # fmt: skip
    cfg.steps, grads = 1, {}
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    for name, p in model.named_parameters():  # the gradient after the last micro-batch, before clipping
        p.register_post_accumulate_grad_hook(lambda p, name=name: grads.__setitem__(name, p.grad.clone()))
    batches = train_recording(cfg, model, optimizer, data, folder / "agentic")
    row = json.loads((folder / "agentic" / "metrics.jsonl").read_text().splitlines()[0])
    return {"batch": {k: torch.cat([b[k] for b in batches]) for k in KEYS}, "grads": grads, "row": row,
            "initial": initial, "weights": {k: v.clone() for k, v in model.state_dict().items()}}  # fmt: skip


def test_first_step_async_tau0_equals_sync(cluster, tmp_path, base):
    """runner=local synchronous vs runner=ray asynchronous with tau = 0, K = 1, same seeds: the same first batch
    (non-zero advantages), loss, gradients and updated weights, bit for bit."""
    sync = first_update(tmp_path / "sync", base, "local", asynchronous=False)
    asyn = first_update(tmp_path / "async", base, "ray", asynchronous=True)
    assert sync["batch"]["advantages"].abs().sum() > 0, "the coin rewards should differ within a group"
    for k in KEYS:  # every token, mask, rollout log-prob and advantage
        assert torch.equal(sync["batch"][k], asyn["batch"][k]), k
    assert sync["row"]["loss"] != 0 and sync["row"]["loss"] == asyn["row"]["loss"]
    assert sync["row"]["grad_norm"] > 0 and sync["row"]["grad_norm"] == asyn["row"]["grad_norm"]
    assert sync["grads"].keys() == asyn["grads"].keys() and len(sync["grads"]) > 0
    for name, g in sync["grads"].items():
        assert torch.equal(g, asyn["grads"][name]), name
    assert any(not torch.equal(w, sync["initial"][name]) for name, w in sync["weights"].items())
    for name, w in sync["weights"].items():
        assert torch.equal(w, asyn["weights"][name]), name


def test_slow_trainer_and_a_killed_worker(cluster, tmp_path, base):
    """A slow trainer (workers run ahead on old weights) and worker 0 killed after the first step: no trained sample
    is more than tau versions old, the rule dropped some, and every task id is accounted for exactly once."""
    cfg, _, _, data = data_for(tmp_path, base, tau=1, sync_every=1, workers=2, inflight=3)
    runner, steps, ages = data.runner, 5, []
    try:
        for step in range(steps):
            data.make_step()
            ages += [runner.version - t.first_version for g in data.last_groups for t in g]
            if step == 0:
                runner.pool.kill(0)  # mid-run: worker 0 has tasks queued or running
            time.sleep(0.5)  # the slow trainer
    finally:
        runner.close()
    assert max(ages) <= cfg.agentic.tau
    assert sum(v == "stale" for v in runner.ledger.values()) > 0, "the slow trainer should have caused drops"
    assert runner.pool.restarts >= 1
    assert sorted(runner.ledger) == list(range(runner.take))  # every task handed over is accounted for once
    assert len(runner.trained_ids) == len(set(runner.trained_ids)) == steps * cfg.agentic.groups_per_step
    assert all(runner.ledger[i] == "trained" for i in runner.trained_ids)
    assert runner.trajectories == len(runner.trained_ids) * cfg.agentic.group_size  # no env crashes: no padding


def test_ray_workers_generating_on_a_server(cluster, tmp_path, base):
    """Remote rollouts: Ray rollout actors that generate on `glmstack serve` (the trainer pushing its weights to the
    server) give the in-process run's two steps."""
    pushes = tmp_path / "pushes"
    pushes.mkdir()
    server = RunningServer(str(base), enable_weight_updates=True, weight_root=str(pushes))
    try:
        remote = two_steps(tmp_path / "remote", base, server.url, runner="ray", pushes=str(pushes))
    finally:
        server.stop()
    assert_same_rollouts(two_steps(tmp_path / "local", base), remote)


@pytest.mark.parametrize("asynchronous", [True, False], ids=["async", "sync_oversampled"])
def test_partial_rollouts_hand_over_finished_groups_out_of_order(cluster, tmp_path, base, asynchronous):
    """agentic.partial_rollouts on Ray with a long tail (every third task sleeps): finished groups are handed over
    before an older straggler, which trains at a later step within tau or is dropped as stale; every id handed over
    is accounted for exactly once. The synchronous runner gets the same from over-sampling: ceil(n × 1.5) groups
    outstanding, the first n to finish train, the rest run on over the push; the workers' time is accounted."""
    cfg, _, _, data = data_for(tmp_path, base, envs=[["tests.posttrain.agentic_coin:SlowCoinEnv", 1.0]], tau=2,
                               sync_every=1, workers=2, inflight=3, partial_rollouts=True, asynchronous=asynchronous,
                               partial_oversample=0.5)  # fmt: skip
    runner, steps, ages, rows = data.runner, 5, [], []
    try:
        for _ in range(steps):
            rows.append(data.make_step()[0]["stats"])
            ages += [runner.version - t.first_version for g in data.last_groups for t in g]
    finally:
        runner.close()
    G = cfg.agentic.groups_per_step
    if not asynchronous:  # exactly the over-sampled groups carried over after each batch: ceil(G × 1.5) − G
        assert [r["rollout/carried_groups"] for r in rows] == [math.ceil(G * 1.5) - G] * steps
    assert 0 < rows[-1]["rollout/worker_busy_s"] and all(r["rollout/worker_idle_frac"] < 1 for r in rows)
    assert max(ages) <= cfg.agentic.tau
    assert runner.trained_ids != sorted(runner.trained_ids), runner.trained_ids  # a straggler did not hold its batch
    assert len(runner.trained_ids) == len(set(runner.trained_ids)) == steps * cfg.agentic.groups_per_step
    handed = sorted(runner.ledger)
    assert len(handed) == len(set(handed)) and all(runner.ledger[i] == "trained" for i in runner.trained_ids)
    state = data.state_dict()
    assert state["handed"] == [i for i in handed if i >= state["next_task"]]
