"""Model-based rewards: `rm:<folder>` scores what the reward model scores, and drives a real `glmstack rl` step;
`judge:<url>` asks our own OpenAI-compatible server (uvicorn on 127.0.0.1, the official `openai` client)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from glmstack.chat import render
from glmstack.model import ModelConfig
from glmstack.posttrain.rl import rewards
from glmstack.posttrain.rl.judges import parse_score
from glmstack.posttrain.rl.rollouts import Rollouts
from glmstack.posttrain.rl.stage import RLOptions
from glmstack.posttrain.rl.tasks import make_task
from glmstack.posttrain.rm.model import RewardModel, save_rm
from tests.serve_fixture import RunningServer


@pytest.fixture(scope="module")
def rm_folder(base_dir, tok, tmp_path_factory):
    rm = RewardModel(ModelConfig.from_hf(base_dir)).materialize("cpu")
    state = rm.state_dict()
    for name, t in rm.initial_tensors(seed=5):
        state[name].copy_(t)
    return save_rm(rm.eval(), tmp_path_factory.mktemp("rm") / "rm", tok, pad_token_id=tok.token_id("<|endoftext|>"))


def sample(text: str, question: str = "What is 2 + 3?") -> rewards.Sample:
    return rewards.Sample(meta={"question": question}, tokens=[], text=text, finish="stop", max_new_tokens=8)


def test_rm_reward_is_the_models_score(rm_folder, tok):
    from glmstack.posttrain.rm.model import load_rm

    fn = rewards.get(f"rm:{rm_folder}")
    got = fn([sample("The answer is 5."), sample("I do not know.")])
    rm = load_rm(rm_folder)
    for text, value in zip(["The answer is 5.", "I do not know."], got):
        msgs = [{"role": "user", "content": "What is 2 + 3?"}, {"role": "assistant", "content": text}]
        ids = tok.encode(render(msgs, None, enable_thinking=False))
        with torch.no_grad():
            want = rm(torch.tensor([ids]), torch.tensor([len(ids) - 1]))[0].item()
        assert value == pytest.approx(want, abs=1e-5)
    assert got[0] != got[1]


def test_rl_step_uses_the_rm_reward(rm_folder, base_dir, tok):
    from glmstack.model import load_hf

    model = load_hf(str(base_dir))
    opts = RLOptions(task="arithmetic", samples_per_step=4, curriculum=[[0, 0, 2]], max_new_tokens=4, heldout_n=2,
                     eval_every=0, rewards=[[f"rm:{rm_folder}", 1.0]])  # fmt: skip
    data = Rollouts(model=model, task=make_task("arithmetic", tok), opts=opts, seed=0, micro_batches=1, tokenizer=tok)
    batch = data.make_step()[0]
    assert f"reward/rm:{rm_folder}" in batch["stats"] and batch["advantages"].shape == (4,)
    assert batch["advantages"].abs().sum() > 0  # real-valued scores differ within a group


def test_parse_score():
    assert parse_score("7") == 0.7 and parse_score("Score: 10/10") == 1.0 and parse_score(" 3.5 points") == 0.35
    assert parse_score("no idea") is None and parse_score("42") is None and parse_score("") is None


def test_judge_asks_an_openai_compatible_server(base_dir):
    server = RunningServer(str(base_dir))
    try:
        fn = rewards.get(f"judge:{server.url}|tiny")
        values = fn([sample("The answer is 5."), sample("Paris.", "What is the capital of France?")])
        assert len(values) == 2 and all(0.0 <= v <= 1.0 for v in values)
        assert 0.0 <= fn.stats["judge_unparsed"] <= 1.0  # a random tiny model rarely writes a number
        with pytest.raises(ValueError, match="chat task"):
            fn([dataclasses.replace(sample("x"), meta={"ids": [1, 2]})])
    finally:
        server.stop()
