"""GLM-5's easy-to-hard task curriculum and entropy bonus in agentic RL (issue 18): the curriculum's level follows
the task's step in id order, held-out tasks stay at `level`, bad tables are one-line config errors; the entropy
bonus subtracts exactly coef × the per-sample mean entropy from the DIS loss and its gradient raises the entropy."""

from __future__ import annotations

import copy
import json
import random

import pytest
import torch

from glmstack.config import ConfigError
from glmstack.model.hf import load_hf
from glmstack.posttrain.agentic.stage import AgenticConfig, AgenticOptions, check, level_at, sampler
from glmstack.posttrain.rl.losses import entropy
from glmstack.posttrain.rl.stage import rl_loss


def test_curriculum_moves_from_easy_to_hard_by_step():
    opts = AgenticOptions(envs=[["files", 1.0]], groups_per_step=2, curriculum=[[1, 0], [3, 1]])
    # steps 1-2 take tasks 0-3 (2 groups each), step 3 onwards tasks 4, 5, ...
    assert [level_at(opts, t) for t in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    sample = sampler(opts, seed=5)
    easy, hard = sample(3), sample(4)
    assert easy["files"] == {} and "Create a file" in easy["question"]  # level 0: create a file
    assert "calc.py" in hard["files"] and "fix" in hard  # level 1: fix a bug
    assert sample(4) == hard  # a pure function of the task id (a restarted worker re-runs the same task)
    held = sampler(opts, seed=5, split="test")
    assert all(held(t)["files"] == {} for t in range(20))  # held-out tasks at `level` (0), whatever the step


def test_no_curriculum_keeps_the_level():
    opts = AgenticOptions(envs=[["files", 1.0]], level=1)
    assert {level_at(opts, t) for t in range(50)} == {1}


@pytest.mark.parametrize("table", [[[3, 1], [1, 0]], [[0, 1]], [[1]], [[1, 0, 2]]])
def test_bad_curriculum_is_a_config_error(table):
    cfg = AgenticConfig(init_from="x", agentic=AgenticOptions(curriculum=table))
    with pytest.raises(ConfigError, match="agentic.curriculum"):
        check(cfg)


def _batch(model, n=4, t=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.cfg.vocab_size, (n, t + 1), generator=g)
    mask = torch.ones(n, t)
    mask[:, : t // 2] = 0  # the prompt is not trained
    return {"input_ids": ids[:, :-1], "targets": ids[:, 1:], "mask": mask, "rollout_logp": torch.zeros(n, t),
            "advantages": torch.tensor([1.0, -1.0, 0.5, -0.5]), "temperature": 1.0, "stats": {}}  # fmt: skip


def test_entropy_bonus_is_coef_times_mean_entropy_and_raises_it(base_dir):
    model = load_hf(base_dir, dtype=torch.float32)
    batch = _batch(model)
    with torch.no_grad():  # rollout log-probs = the policy's own (on-policy: DIS masks nothing)
        from glmstack.posttrain.rl.losses import token_logprobs

        batch["rollout_logp"] = token_logprobs(model(batch["input_ids"]).logits.float(), batch["targets"], 1.0)
    plain, bonus = AgenticOptions(), AgenticOptions(entropy_coef=0.1)
    loss0, _ = rl_loss(plain)(model, batch, {})
    loss1, stats = rl_loss(bonus)(model, batch, {})
    with torch.no_grad():
        ent_BT = entropy(model(batch["input_ids"]).logits.float(), 1.0)
    m = batch["mask"]
    per_sample = ((ent_BT * m).sum(-1) / m.sum(-1)).mean()  # the loss's per-sample mean reduction
    torch.testing.assert_close(loss1.detach(), loss0.detach() - 0.1 * per_sample, atol=1e-5, rtol=0)
    assert stats["entropy"] > 0

    # the bonus alone (no advantages) is gradient ascent on the entropy of the trained tokens
    batch["advantages"] = torch.zeros(4)
    moved = copy.deepcopy(model)
    opt = torch.optim.SGD(moved.parameters(), lr=0.5)
    for _ in range(3):
        opt.zero_grad()
        rl_loss(AgenticOptions(entropy_coef=1.0))(moved, batch, {})[0].backward()
        opt.step()
    with torch.no_grad():
        after = entropy(moved(batch["input_ids"]).logits.float(), 1.0)
    assert ((after * m).sum() / m.sum()) > ((ent_BT * m).sum() / m.sum()) + 1e-3


def test_python_level_1_is_a_wider_task_space_solved_in_the_sandbox():
    from glmstack.posttrain.agentic.envs import make_env
    from glmstack.posttrain.agentic.envs.tools import NEW_WORDS, PythonEnv
    from tests.posttrain.test_agentic_envs import call, play, say

    rng = random.Random(0)
    easy = {json.dumps(PythonEnv.sample(rng, "train", 0), sort_keys=True) for _ in range(400)}
    hard = {json.dumps(PythonEnv.sample(rng, "train", 1), sort_keys=True) for _ in range(400)}
    assert len(hard) > 2 * len(easy) and any(w in s for s in hard for w in NEW_WORDS)
    spec = PythonEnv.sample(random.Random(3), "train", 1)
    code = spec["args"]["code"]
    outs, _ = play(make_env("python"), spec, [call("python", code=code), say("The result is ?")])
    result = outs[0].messages[0]["content"]
    _, r = play(make_env("python"), spec, [call("python", code=code), say(f"The result is {result}.")])
    assert r.success and not result.startswith("Error")
