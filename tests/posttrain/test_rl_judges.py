"""Model-based rewards: `rm:<folder>` scores what the reward model scores (without an autograd graph), and drives
a real `glmstack rl` step; `judge:<url>` asks our own OpenAI-compatible server (uvicorn on 127.0.0.1, the official
`openai` client) and a stand-in GLM server that thinks unless told not to."""

from __future__ import annotations

import dataclasses
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest
import torch

from glmstack.chat import render
from glmstack.model import ModelConfig
from glmstack.posttrain.rl import judges, rewards
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


def test_rm_reward_scores_without_autograd(rm_folder):
    """The scorer runs under no_grad (issue 35: @torch.no_grad() decorated the factory, so every score built a graph
    through the reward model)."""
    fn = rewards.get(f"rm:{rm_folder}")
    rm, _ = judges._load(str(rm_folder))
    seen = []
    hook = rm.register_forward_hook(lambda m, args, out: seen.append((torch.is_grad_enabled(), out[0].requires_grad)))
    try:
        assert torch.is_grad_enabled()
        fn([sample("The answer is 5.")])
    finally:
        hook.remove()
    assert seen == [(False, False)]


def test_rl_step_uses_the_rm_reward(rm_folder, base_dir, tok):
    from glmstack.model import load_hf

    model = load_hf(str(base_dir))
    opts = RLOptions(task="arithmetic", samples_per_step=4, curriculum=[[0, 0, 2]], max_new_tokens=4, heldout_n=2,
                     eval_every=0, rewards=[[f"rm:{rm_folder}", 1.0]])  # fmt: skip
    data = Rollouts(model=model, task=make_task("arithmetic", tok), opts=opts, seed=0, micro_batches=1, tokenizer=tok)
    batch = data.make_step()[0]
    assert f"reward/rm:{rm_folder}" in batch["stats"] and batch["advantages"].shape == (4,)
    assert batch["advantages"].abs().sum() > 0  # real-valued scores differ within a group


def test_heldout_reports_the_rm_score_beside_the_task_accuracy(rm_folder, base_dir, tok):
    """With rl.rewards = an RM, held-out evaluation scores the same greedy replies twice: the task's verifier
    (heldout_acc) and the training reward (heldout_reward, what PPO / GRPO with an RM raise)."""
    from glmstack.model import load_hf

    model = load_hf(str(base_dir))
    rm_opts = RLOptions(task="arithmetic", samples_per_step=4, curriculum=[[0, 0, 2]], max_new_tokens=4,
                        heldout_n=3, eval_every=1, rewards=[[f"rm:{rm_folder}", 1.0]])  # fmt: skip
    data = Rollouts(model=model, task=make_task("arithmetic", tok), opts=rm_opts, seed=0, micro_batches=1,
                    tokenizer=tok)  # fmt: skip
    stats = data.make_step()[0]["stats"]
    data.prepare_eval()
    _, replies = data.generate(data.heldout, 1, 0.0, ("heldout", 0), engine=data.eval_engine)
    want = sum(rewards.get(f"rm:{rm_folder}")(replies)) / 3
    assert stats["heldout_reward"] == pytest.approx(want, abs=1e-6) and "heldout_acc" in stats
    own = dataclasses.replace(rm_opts, rewards=[])  # the task's own reward: one score, no heldout_reward
    plain = Rollouts(model=model, task=make_task("arithmetic", tok), opts=own, seed=0, micro_batches=1, tokenizer=tok)
    assert "heldout_reward" not in plain.make_step()[0]["stats"]


def test_parse_score():
    assert parse_score("7") == 0.7 and parse_score("Score: 10/10") == 1.0 and parse_score(" 3.5 points") == 0.35
    assert parse_score("no idea") is None and parse_score("42") is None and parse_score("") is None
    # the reasoning is not the answer: 2 + 3 inside <think> is not a score, an unclosed <think> has no answer
    assert parse_score("<think>2 + 3 = 5, right.</think>8") == 0.8 and parse_score("2 + 3 is 5.</think> 6") == 0.6
    assert parse_score("<think>2 + 3 is") is None


class GLMJudge(BaseHTTPRequestHandler):
    """A stand-in for a GLM model behind vLLM / SGLang / `glmstack serve`: thinking is on unless the request's
    chat_template_kwargs turn it off, the reasoning (with numbers in it) comes before the score in `content`, and
    max_tokens cuts the reply, counted in words. `stubborn` servers reason whatever the request says."""

    REASONING = "The question asks for 2 + 3 . The answer says 5 , which is right , so 9 out of 10 ."
    stubborn = False
    requests: ClassVar[list] = []  # the request bodies (each test makes its own subclass)

    def do_GET(self):  # /v1/models
        self._send({"object": "list", "data": [{"id": "glm", "object": "model", "created": 0, "owned_by": "t"}]})

    def do_POST(self):  # /v1/chat/completions
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(body)
        thinking = self.stubborn or (body.get("chat_template_kwargs") or {}).get("enable_thinking", True)
        words = (["<think>", *self.REASONING.split(), "</think>"] if thinking else []) + ["9"]
        cut = body.get("max_tokens") or len(words)
        message = {"role": "assistant", "content": " ".join(words[:cut])}
        choice = {"index": 0, "message": message, "finish_reason": "length" if len(words) > cut else "stop"}
        self._send({"id": "c", "object": "chat.completion", "created": 0, "model": "glm", "choices": [choice]})

    def _send(self, obj: dict):
        data = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("stubborn", [False, True])
def test_judge_turns_thinking_off_and_reads_the_answer(stubborn):
    """A GLM judge thinks by default: the reward asks with thinking off and room for the answer, and reads the score
    after any reasoning (issue 35: max_tokens=8 and thinking on left every score 0 or a number from the reasoning)."""
    handler = type("Judge", (GLMJudge,), {"stubborn": stubborn, "requests": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        fn = judges.judge(f"http://127.0.0.1:{server.server_address[1]}")
        assert fn([sample("The answer is 5."), sample("5")]) == [0.9, 0.9]
        assert fn.stats["judge_unparsed"] == 0.0
        asked = handler.requests[-1]
        assert asked["chat_template_kwargs"] == {"enable_thinking": False} and asked["max_tokens"] >= 64
    finally:
        server.shutdown()
        server.server_close()


def test_judge_asks_an_openai_compatible_server(base_dir):
    server = RunningServer(str(base_dir))
    try:
        fn = rewards.get(f"judge:{server.url}|tiny")  # our server takes chat_template_kwargs (a 400 otherwise)
        values = fn([sample("The answer is 5."), sample("Paris.", "What is the capital of France?")])
        assert len(values) == 2 and all(0.0 <= v <= 1.0 for v in values)
        assert 0.0 <= fn.stats["judge_unparsed"] <= 1.0  # a random tiny model rarely writes a number
        with pytest.raises(ValueError, match="chat task"):
            fn([dataclasses.replace(sample("x"), meta={"ids": [1, 2]})])
    finally:
        server.stop()
