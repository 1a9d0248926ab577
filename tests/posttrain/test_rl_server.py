"""RL rollouts from our OpenAI-compatible server (uvicorn on 127.0.0.1, the official `openai` client) give the same
tokens and the same first-step loss as the in-process engine (issue 17: within 1e-5)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from glmstack.model import load_hf
from glmstack.posttrain.rl.rollouts import Rollouts
from glmstack.posttrain.rl.stage import RLOptions, rl_loss
from glmstack.posttrain.rl.tasks import make_task
from tests.serve_fixture import RunningServer


def test_server_rollouts_equal_in_process_first_step(base_dir, tok, tmp_path):
    model = load_hf(str(base_dir))
    opts = RLOptions(task="toy", samples_per_step=8, curriculum=[[0, 0, 4]], max_new_tokens=4, heldout_n=2,
                     eval_every=0, mismatch="icepop")  # fmt: skip
    server = RunningServer(str(base_dir), enable_weight_updates=True, weight_root=str(tmp_path))
    try:
        remote = dataclasses.replace(opts, rollout_server=server.url, server_model="tiny",
                                     rollout_weights_dir=str(tmp_path))  # the trainer pushes before step 0
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


def test_rl_through_a_server_trains_the_served_policy(tmp_path, base_dir, tok):
    """`glmstack rl --set rl.rollout_server=URL` over 3 steps: the weights go to the server before every step (the
    run's updates equal the in-process run's, which they could not with a frozen server from step 2 on), the
    server ends on the exported model (version 3, its log-probs the model folder's), and the held-out score is
    the exported weights' (the in-process run's)."""
    import json

    from tests.serve_fixture import rl_here_and_on_server

    common = ["--set", f"init_from={base_dir}", "--set", "steps=3", "--set", "rl.eval_every=0", "--set",
              "rl.heldout_n=4", "--set", "log.plots=false", "--set", "schedule.warmup_steps=0"]  # fmt: skip
    probe = [5, 9, 17, 3, 4, 30, 21]

    def ask(server):
        from glmstack.posttrain.rl.remote import ServerEngine

        reported = ServerEngine(server.url, "tiny").generate([[5, 9]], 2, temperature=1.0, seeds=[0]).weight_versions
        return reported, server_logprobs(server.url, probe)

    rows, version, (reported, served) = rl_here_and_on_server("rl_tiny", "rl", base_dir, tmp_path, common, ask)
    # rollout log-probs come from the server's forward passes (its own batch shapes): fp32 rounding moved a grad norm
    # by 1.3e-4 relative on an AVX-512 CPU;
    # a frozen server from step 2 on changes the data, and the norm by far more
    for a, b in zip(rows["local"], rows["remote"]):
        assert abs(a["grad_norm"] - b["grad_norm"]) <= 5e-4 * a["grad_norm"] and b["weight_version"] == b["step"] - 1
        assert b["staleness_max"] == 0.0  # the server's own per-response version: the pushed one
    assert version == 3 and reported == [3]  # each response says which weights generated it
    exported = load_hf(str(tmp_path / "remote" / "tiny" / "rl" / "model"))
    with torch.no_grad():
        ids = torch.tensor([probe])
        want = torch.log_softmax(exported(ids[:, :-1]).logits.float(), -1).gather(-1, ids[:, 1:, None])[0, :, 0]
    torch.testing.assert_close(torch.tensor(served), want, atol=1e-4, rtol=0)
    summary = {k: json.loads((tmp_path / k / "tiny" / "rl" / "rl_summary.json").read_text()) for k in rows}
    assert summary["remote"]["heldout_end"] == summary["local"]["heldout_end"]


def server_logprobs(url: str, ids: list[int], model: str = "tiny") -> list[float]:
    """The server's log-prob of each token after the first (echo + logprobs, the scoring request)."""
    from openai import OpenAI

    r = OpenAI(base_url=url + "/v1", api_key="none").completions.create(
        model=model, prompt=ids, max_tokens=1, echo=True, logprobs=0, temperature=0.0
    )
    return list(r.choices[0].logprobs.token_logprobs[1 : len(ids)])


@pytest.mark.parametrize("push", ["adapter", "merged"])
def test_lora_rl_through_a_server_serves_the_trained_policy(push, tmp_path, base_dir, tok):
    """A LoRA policy's pushes: its adapters alone, served beside the untouched base under the rollout model's name
    (`rl.server_lora=adapter`, the default; `glmstack serve --enable-lora`), or folded into the base weights
    ("merged", for servers without LoRA). After 2 steps the server's log-probs are the in-process policy's (base +
    adapters) and its updates equal the in-process run's."""
    import httpx

    from glmstack.model.merge import merge
    from tests.serve_fixture import rl_here_and_on_server

    common = ["--set", f"init_from={base_dir}", "--set", "steps=2", "--set", "rl.eval_every=0", "--set",
              "rl.heldout_n=4", "--set", "log.plots=false", "--set", "schedule.warmup_steps=0", "--set",
              "lora.enabled=true", "--set", "optim.muon=false", "--set", "optim.lr=1e-2",
              "--set", f"rl.server_lora={push}"]  # fmt: skip
    probe = [5, 9, 17, 3, 4, 30, 21]
    name = "policy" if push == "adapter" else "tiny"
    options = {"enable_lora": True} if push == "adapter" else {}

    def while_up(server):
        served = {m: server_logprobs(server.url, probe, m) for m in {name, "tiny"}}
        return served, httpx.get(server.url + "/v1/models").json()["data"]

    rows, version, (served, models) = rl_here_and_on_server("rl_tiny", "rl", base_dir, tmp_path, common, while_up,
                                                            served_as=name, **options)  # fmt: skip
    for a, b in zip(rows["local"], rows["remote"]):
        assert abs(a["grad_norm"] - b["grad_norm"]) <= 1e-4 * a["grad_norm"]
    assert version == 2
    step = max((tmp_path / "remote" / "tiny" / "rl").glob("step_*"))  # a PEFT adapter folder
    policy = merge(base_dir, step, tmp_path / "merged", dtype=torch.float32)  # glmstack merge: base + adapters
    base_model = load_hf(str(base_dir))
    with torch.no_grad():
        ids = torch.tensor([probe])
        want = torch.log_softmax(policy(ids[:, :-1]).logits.float(), -1).gather(-1, ids[:, 1:, None])[0, :, 0]
        base = torch.log_softmax(base_model(ids[:, :-1]).logits.float(), -1).gather(-1, ids[:, 1:, None])[0, :, 0]
    assert (want - base).abs().max() > 1e-3  # the adapters moved the policy
    torch.testing.assert_close(torch.tensor(served[name]), want, atol=1e-4, rtol=0)
    if push == "adapter":  # the base it serves beside them is untouched: only the adapters were pushed
        torch.testing.assert_close(torch.tensor(served["tiny"]), base, atol=1e-5, rtol=0)
        assert [(m["id"], m.get("parent")) for m in models] == [("tiny", None), ("policy", "tiny")]
