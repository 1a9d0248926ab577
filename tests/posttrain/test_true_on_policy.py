"""rl.true_on_policy / agentic.true_on_policy (issue 38): the sampler and the trainer compute every log-prob with
model/invariant.py's ops in the trainer's precision, so at every step every trained token's rollout log-prob is the
trainer's recomputation bit for bit (`logp_diff_frac` = 0, `mean_abs_logp_diff` = 0) — fp32 and bf16, one update
per batch and PPO-style updates (π_old from old_logprobs), reasoning RL and agentic RL. The default engine against
a bf16 trainer differs on every token; settings that make a mismatch on purpose are refused."""

from __future__ import annotations

import json

import pytest

from glmstack.config import ConfigError
from glmstack.model import GLM, ModelConfig
from glmstack.posttrain.agentic.stage import run_agentic
from glmstack.posttrain.policy import EnginePolicy
from glmstack.posttrain.rl.stage import check, run_rl
from tests.posttrain.test_agentic_stage import tiny_cfg as agentic_cfg
from tests.posttrain.test_rl_stage import small_cfg


def metrics(folder) -> list[dict]:
    rows = [json.loads(x) for x in next(folder.rglob("metrics.jsonl")).read_text().splitlines()]
    return [r for r in rows if "logp_diff_frac" in r]


@pytest.mark.parametrize("dtype,updates", [("float32", 2), ("bfloat16", 1)])
def test_rl_rollout_logprobs_are_the_trainers_at_every_step(tmp_path, dtype, updates):
    cfg = small_cfg(tmp_path, true_on_policy=True, max_new_tokens=10, ppo_epochs=updates)
    cfg.steps, cfg.dtype = 3 * updates, dtype
    assert run_rl(cfg)["stopped"] == "done"
    assert json.loads(next(tmp_path.rglob("rl_summary.json")).read_text())["logp_bitwise_every_step"] is True
    rows = metrics(tmp_path)
    assert len(rows) == cfg.steps  # every update: π_old (the trainer at the rollout weights) vs the sampler
    assert all(r["logp_diff_frac"] == 0.0 and r["mean_abs_logp_diff"] == 0.0 for r in rows), rows
    assert all(r["mismatch_masked_frac"] == 0.0 for r in rows)  # IcePop masks nothing


def test_default_engine_against_a_bf16_trainer_differs(tmp_path):
    cfg = small_cfg(tmp_path, max_new_tokens=10)
    cfg.steps, cfg.dtype = 2, "bfloat16"
    run_rl(cfg)
    rows = metrics(tmp_path)
    assert all(r["logp_diff_frac"] > 0.5 and r["mean_abs_logp_diff"] > 0 for r in rows), rows


@pytest.mark.parametrize("setting", [{"rollout_dtype": "bfloat16"}, {"rollout_noise": 0.1},
                                     {"rollout_server": "http://127.0.0.1:1"}])
def test_settings_that_mismatch_on_purpose_are_refused(tmp_path, setting):
    with pytest.raises(ConfigError, match="true_on_policy"):
        check(small_cfg(tmp_path, true_on_policy=True, **setting))


def test_mla_models_are_refused():
    model = GLM(ModelConfig.preset("tiny-glm47-flash")).init_weights(seed=0)
    with pytest.raises(ValueError, match="GQA text models only"):
        EnginePolicy(model, invariant=True)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_agentic_rollout_logprobs_are_the_trainers(tmp_path, base_dir, dtype):
    cfg = agentic_cfg(tmp_path, base_dir, true_on_policy=True, asynchronous=False)  # on policy: no staleness
    cfg.steps, cfg.dtype = 2, dtype
    result = run_agentic(cfg)
    assert result["stopped"] == "done" and result["logp_bitwise_every_step"] is True
    rows = metrics(tmp_path)
    assert len(rows) == 2 and all(r["logp_diff_frac"] == 0.0 and r["mean_abs_logp_diff"] == 0.0 for r in rows), rows
    assert all(r["mismatch_masked_frac"] == 0.0 for r in rows if "mismatch_masked_frac" in r)


def test_replay_changes_nothing_under_true_on_policy(tmp_path):
    """The sampler and the trainer route every token alike bit for bit, so replaying the sampler's experts is a
    no-op: the same losses and gradient norms at every step."""
    runs = []
    for replay in ("off", "replay"):
        cfg = small_cfg(tmp_path / replay, true_on_policy=True, max_new_tokens=10, routing_replay=replay)
        cfg.steps = 3
        run_rl(cfg)
        runs.append(metrics(tmp_path / replay))
    assert [(r["loss"], r["grad_norm"]) for r in runs[0]] == [(r["loss"], r["grad_norm"]) for r in runs[1]]
    assert all(r["routing_diff_frac"] == 0.0 for r in runs[1])
