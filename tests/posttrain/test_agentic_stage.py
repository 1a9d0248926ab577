"""The agentic RL stage (issue 18) on a tiny random chat model: tokens in, tokens out (the trajectory's rollout
log-probs are the trainer's at its model tokens, the loss mask covers exactly those), the stage end to end on the
one loop with runner=local, the optimizer reset after each weight push, and the CLI's bad input."""

from __future__ import annotations

import json
import random

import pytest
import torch

from glmstack.model.hf import load_hf
from glmstack.posttrain.agentic.env import EnvOptions
from glmstack.posttrain.agentic.envs import env_class
from glmstack.posttrain.agentic.episode import EpisodeOptions, run_group
from glmstack.posttrain.agentic.stage import build, run_agentic
from glmstack.posttrain.agentic.worker import RolloutWorker
from glmstack.posttrain.rl.losses import token_logprobs
from glmstack.recipes.agentic_tiny import agentic as tiny


def tiny_cfg(tmp_path, base_dir, **agentic):
    cfg = tiny()
    cfg.out_dir, cfg.init_from = str(tmp_path), str(base_dir)
    cfg.agentic.envs = [["roles", 1.0]]
    for k, v in agentic.items():
        setattr(cfg.agentic, k, v)
    return cfg


def test_trajectory_tokens_and_logprobs_are_what_the_trainer_sees(base_dir, tok):
    model = load_hf(base_dir, dtype=torch.float32)
    opts = EpisodeOptions(max_turns=2, max_new_tokens=64, temperature=1.5)  # a random model: stop tokens are rare
    worker = RolloutWorker(model, str(base_dir), opts, EnvOptions(), seed=0)
    rng = random.Random(0)
    specs = [env_class(n).sample(rng, "train") for n in ["roles"] * 7 + ["calculator"]]
    trajs = run_group(worker.policy, tok, specs, opts, EnvOptions(), list(range(8)))
    assert any(t.turns == 2 for t in trajs), "a roles episode should reach its reviewer turn"
    for t in trajs:
        assert len(t.ids) == len(t.mask) == len(t.logprobs) and sum(t.mask) > 0
        ids = torch.tensor([t.ids])
        with torch.no_grad():
            logp = token_logprobs(model(ids[:, :-1]).logits, ids[:, 1:], opts.temperature)[0]
        model_pos = [k - 1 for k in range(1, len(t.ids)) if t.mask[k]]
        torch.testing.assert_close(logp[model_pos], torch.tensor([t.logprobs[k + 1] for k in model_pos]),
                                   atol=1e-4, rtol=0)  # fmt: skip
        assert t.mask[: t.prompt_len] == [0] * t.prompt_len


@pytest.mark.slow
def test_stage_end_to_end_local(tmp_path, base_dir):
    cfg = tiny_cfg(tmp_path, base_dir, heldout_n=4, eval_every=1)
    cfg.log.plots = True
    result = run_agentic(cfg)
    assert result["stopped"] == "done" and result["accepted_trajectories"] == 16
    rows = [json.loads(x) for x in (tmp_path / "tiny" / "agentic" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert {"reward", "success", "traj_per_s", "weight_version", "heldout_success", "staleness_max"} <= set(rows[0])
    assert rows[1]["weight_version"] == 1.0 and rows[1]["staleness_max"] <= cfg.agentic.tau
    assert (tmp_path / "tiny" / "agentic" / "agentic_summary.json").exists()
    assert list((tmp_path / "tiny" / "agentic" / "plots").glob("agentic_*.png"))
    assert (tmp_path / "tiny" / "agentic" / "model" / "tokenizer.json").exists()


def test_micro_batch_mask_is_the_model_tokens(tmp_path, base_dir):
    from glmstack.train.stage import model_and_optimizer

    cfg = tiny_cfg(tmp_path, base_dir)
    model, optimizer = model_and_optimizer(cfg)
    data = build(cfg, model, optimizer, str(base_dir))
    batches = data.make_step()
    flat = [t for g in data.last_groups for t in g]
    mask = torch.cat([b["mask"] for b in batches])
    assert mask.sum() == sum(t.model_tokens for t in flat)
    no_signal = [len({t.reward for t in g}) == 1 for g in data.last_groups]  # groups that teach nothing
    assert batches[0]["stats"]["zero_var_frac"] == sum(no_signal) / len(no_signal)
    data.runner.close()


def test_zero_var_frac_counts_the_groups_that_teach_nothing():
    """A group whose rewards are all equal has advantages 0 (the 60-minute speedrun's agentic stage: every group, on
    18 of 20 steps); one reward apart (a call penalty) is signal."""
    from glmstack.posttrain.agentic.data import zero_var_frac

    rewards = [1.0] * 4 + [0.0] * 4 + [1.0, 1.0, 1.0, 0.95] + [0.95] * 4
    assert zero_var_frac(rewards, 4) == 0.75 and zero_var_frac(rewards[4:8], 4) == 1.0
    assert zero_var_frac(rewards, 8) == 0.0  # both halves mix rewards


def test_optimizer_reset_after_each_push(tmp_path, base_dir):
    """K = 2: the state built by step 0 survives step 1 and is gone when step 2's push happens; staleness counts
    trainer steps, so step 1's samples (weights of step 0, no push between) are 1 step stale."""
    from glmstack.posttrain.rl.stage import rl_loss
    from glmstack.train.stage import model_and_optimizer

    cfg = tiny_cfg(tmp_path, base_dir, sync_every=2, tau=1)
    model, optimizer = model_and_optimizer(cfg)
    data = build(cfg, model, optimizer, str(base_dir))
    loss_fn, sizes, versions, stale = rl_loss(cfg.agentic), [], [], []
    for _ in range(3):
        batches = data.make_step()
        versions.append(data.runner.version)
        stale.append(batches[0]["stats"]["staleness_max"])
        sizes.append(sum(len(o.state) for o in optimizer.optimizers.values()))
        for b in batches:
            loss, _ = loss_fn(model, b, {})
            (loss + 0 * sum(p.sum() for p in model.parameters())).backward()  # every parameter gets a state
        optimizer.step()
        optimizer.zero_grad()
    assert versions == [0, 0, 2] and stale == [0.0, 1.0, 0.0]
    assert sizes[0] == 0 and sizes[1] > 0 and sizes[2] == 0
    data.runner.close()


def test_cli_bad_environment_is_one_line(capsys, base_dir):
    from glmstack.cli import main

    code = main(["agentic-rl", "agentic_tiny", "--set", f"init_from={base_dir}", "--set",
                 'agentic.envs=[["nope", 1.0]]'])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert code == 2 and "unknown environment 'nope'" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize(
    "bad", ["agentic.partial_oversample=-0.5", "agentic.env.tool_latency_s=-1", "agentic.dynamic_sampling_max=0.5"]
)
def test_cli_bad_partial_and_latency_options_are_one_line(capsys, base_dir, bad):
    from glmstack.cli import main

    code = main(["agentic-rl", "agentic_tiny", "--set", f"init_from={base_dir}", "--set", bad])
    err = capsys.readouterr().err.strip()
    assert code == 2 and bad.split("=")[0].split(".")[-1] in err and len(err.splitlines()) == 1


def test_a_task_waits_for_the_weights_pushed_before_it(base_dir):
    """A Ray actor gets weights on another thread than its rollouts: a group submitted after push v must not start
    on the weights before it (min_version), and its first turn records v."""
    import threading

    model = load_hf(base_dir, dtype=torch.float32)
    worker = RolloutWorker(model, str(base_dir), EpisodeOptions(max_turns=1, max_new_tokens=4), EnvOptions(), seed=0)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    worker.set_weights(state, 0)
    spec = env_class("roles").sample(random.Random(0), "train")
    threading.Timer(0.3, worker.set_weights, (state, 1)).start()  # version 1 lands while the rollout is asked for
    group = worker.rollout(0, spec, 2, min_version=1)
    assert [t.versions[0] for t in group] == [1, 1]
    assert [t.versions[0] for t in worker.rollout(1, spec, 2)] == [1, 1]  # min_version 0: what is loaded


def test_environment_by_import_path(capsys, base_dir):
    """Your own Env subclass by "module:Class": tasks carry the path (Ray actors import it by it); a bad path is the
    CLI's one-line error."""
    from glmstack.cli import main
    from glmstack.posttrain.agentic.stage import sampler

    path = "tests.posttrain.agentic_coin:CoinEnv"
    opts = tiny().agentic
    opts.envs = [[path, 1.0]]
    spec = sampler(opts, seed=0)(3)
    assert spec["env"] == path and env_class(path).__name__ == "CoinEnv"
    for bad in ("tests.posttrain.agentic_coin:Nope", "glmstack.posttrain.agentic.env:EnvOptions"):
        code = main(["agentic-rl", "agentic_tiny", "--set", f"init_from={base_dir}", "--set",
                     f'agentic.envs=[["{bad}", 1.0]]'])  # fmt: skip
        err = capsys.readouterr().err.strip()
        assert code == 2 and bad in err and len(err.splitlines()) == 1


def test_spread_table_and_band_test(tmp_path, capsys):
    """spread.py: per-window seed statistics, and which setting's mean lies inside the other's seed band."""
    from glmstack.posttrain.agentic.spread import main as spread

    curves = {"a0": [0.0, 0.25, 0.5, 0.5], "a1": [0.5, 0.25, 0.5, 1.0],  # a's mean: 0.25 0.25 0.5 0.75
              "b0": [0.25, 0.0, 1.0, 0.75], "b1": [0.25, 0.5, 1.0, 0.75]}  # fmt: skip
    for run, ys in curves.items():
        (tmp_path / run).mkdir()
        rows = [json.dumps({"step": i + 1, "reward": y}) for i, y in enumerate(ys)]
        (tmp_path / run / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    a, b = (",".join(str(tmp_path / f"{s}{k}") for k in range(2)) for s in "ab")
    assert spread([f"a={a}", f"b={b}", "--window", "2", "--plot", str(tmp_path / "p.png")]) == 0
    out = capsys.readouterr().out
    assert "| a | 2 | 0.250 ± 0.177 [0.125, 0.375] |" in out  # steps 1-2: seed means 0.125 and 0.375
    assert "a's mean is inside b's seeds' [min, max]: 75%; b's inside a's: 75% (4 steps)" in out  # not at step 3
    assert (tmp_path / "p.png").exists()


@pytest.mark.slow
def test_partial_rollouts_with_the_local_runner_equal_the_plain_path(tmp_path, base_dir):
    """runner=local runs tasks in id order, so nothing overtakes anything: agentic.partial_rollouts with
    over-sampling (its extra groups queued, run at the next step on the weights then pushed) trains on exactly the
    plain path's batches and ends on the same weights, bit for bit, over three steps."""
    from glmstack.train.stage import model_and_optimizer
    from tests.posttrain.test_agentic_server import COIN, train_recording

    def run(folder, partial: bool):
        cfg = tiny_cfg(folder, base_dir, envs=[[COIN, 1.0]], asynchronous=False, tau=1, partial_rollouts=partial,
                       partial_oversample=0.5)  # fmt: skip
        cfg.steps = 3
        model, optimizer = model_and_optimizer(cfg)
        batches = train_recording(cfg, model, optimizer, build(cfg, model, optimizer, str(base_dir)), folder / "ag")
        return batches, model.state_dict()

    (plain, w_plain), (partial, w_partial) = run(tmp_path / "plain", False), run(tmp_path / "partial", True)
    assert len(plain) == len(partial) == 3 * 2
    for a, b in zip(plain, partial):
        for k in ("input_ids", "mask", "rollout_logp", "advantages"):
            assert torch.equal(a[k], b[k]), k
    assert any(b["advantages"].abs().sum() > 0 for b in plain)  # the steps moved the weights
    assert [b["stats"]["rollout/carried_groups"] for b in partial[::2]] == [1.0] * 3  # ceil(2 × 1.5) − 2 over-sampled
    assert [b["stats"]["rollout/carried_groups"] for b in plain[::2]] == [0.0] * 3
    assert all(torch.equal(w_plain[k], w_partial[k]) for k in w_plain)


@pytest.mark.slow
def test_dynamic_sampling_trains_only_informative_groups(tmp_path, base_dir):
    """agentic.dynamic_sampling: the coin's rewards are a function of (seed, task id, index) only, so the plain path
    says which groups are flat (all rewards equal, advantage 0); with the option every trained group is one of the
    others, in id order, over three steps, the flat ones are counted and set aside — and with dynamic_sampling_max=1
    no extra group is looked at: the plain path's groups are trained."""
    from glmstack.train.stage import model_and_optimizer
    from tests.posttrain.test_agentic_server import COIN, train_recording

    def run(folder, **kw):
        cfg = tiny_cfg(folder, base_dir, envs=[[COIN, 1.0]], asynchronous=False, group_size=2, **kw)
        cfg.steps = 3
        model, optimizer = model_and_optimizer(cfg)
        data = build(cfg, model, optimizer, str(base_dir))
        batches = train_recording(cfg, model, optimizer, data, folder / "ag")
        return batches, data.runner

    plain, plain_runner = run(tmp_path / "plain")
    flat = {i: bool(b["advantages"].abs().sum() == 0) for i, b in enumerate(plain)}  # one group per micro-batch
    assert plain_runner.trained_ids == list(range(6)) and any(flat.values()) and not all(flat.values())
    dyn, runner = run(tmp_path / "dyn", dynamic_sampling=True)
    assert all(b["advantages"].abs().sum() > 0 for b in dyn)
    informative = [i for i in range(6) if not flat[i]]
    assert runner.trained_ids[: len(informative)] == informative and len(runner.trained_ids) == 6
    assert sorted(i for i, v in runner.ledger.items() if v == "flat")[: sum(flat.values())] == [
        i for i in range(6) if flat[i]]  # fmt: skip
    counted = sum(b["stats"].get("rollout/flat_groups", 0) for b in dyn[::2])  # the step's stats on each micro-batch
    assert counted == sum(v == "flat" for v in runner.ledger.values()) > 0
    _, capped_runner = run(tmp_path / "capped", dynamic_sampling=True, dynamic_sampling_max=1.0)
    steps = lambda ids: [sorted(ids[k : k + 2]) for k in range(0, 6, 2)]
    assert steps(capped_runner.trained_ids) == steps(plain_runner.trained_ids)
