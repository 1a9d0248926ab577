"""RL rollouts from our OpenAI-compatible server (uvicorn on 127.0.0.1, the official `openai` client) give the same
tokens and the same first-step loss as the in-process engine (issue 17: within 1e-5)."""

from __future__ import annotations

import dataclasses

import torch

from glmstack.model import load_hf
from glmstack.posttrain.rl.rollouts import Rollouts
from glmstack.posttrain.rl.stage import RLOptions, rl_loss
from glmstack.posttrain.rl.tasks import make_task
from tests.serve_fixture import RunningServer


def test_server_rollouts_equal_in_process_first_step(base_dir, tok):
    model = load_hf(str(base_dir))
    opts = RLOptions(task="toy", samples_per_step=8, curriculum=[[0, 0, 4]], max_new_tokens=4, heldout_n=2,
                     eval_every=0, mismatch="icepop")  # fmt: skip
    server = RunningServer(str(base_dir))
    try:
        remote = dataclasses.replace(opts, rollout_server=server.url, server_model="tiny")
        steps = [Rollouts(model=model, task=make_task("toy"), opts=o, seed=0, micro_batches=1, tokenizer=tok)
                 .make_step()[0] for o in (opts, remote)]  # fmt: skip
    finally:
        server.stop()
    local, served = steps
    assert torch.equal(local["input_ids"], served["input_ids"]) and torch.equal(local["mask"], served["mask"])
    torch.testing.assert_close(local["rollout_logp"], served["rollout_logp"], atol=1e-5, rtol=0)
    loss_fn = rl_loss(opts)
    with torch.no_grad():
        a, b = loss_fn(model, local, {})[0], loss_fn(model, served, {})[0]
    assert abs(float(a) - float(b)) <= 1e-5
