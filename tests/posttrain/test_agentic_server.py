"""Agentic rollouts on our OpenAI-compatible server (issue 18's remote rollouts; uvicorn on 127.0.0.1, the official
`openai` client): two steps of the real loop whose workers generate on the server, the trainer pushing its weights
to it after each update (POST /update_weights_from_disk), give the in-process run's trajectories — the same token
ids, the rollout log-probs within 1e-5 (+ 1e-5 relative) at both steps, so the second step ran on the pushed weights — and the server
reports the pushed version. Bad pushes are a 400 that leaves the served weights alone."""

from __future__ import annotations

import httpx
import torch
from safetensors.torch import save_file

from glmstack.model.hf import load_hf
from glmstack.posttrain.agentic.stage import build
from glmstack.posttrain.rl.losses import token_logprobs
from glmstack.posttrain.rl.stage import rl_loss
from glmstack.recipes.agentic_tiny import agentic as tiny
from glmstack.train.loop import train
from glmstack.train.stage import model_and_optimizer
from tests.serve_fixture import RunningServer

COIN = "tests.posttrain.agentic_coin:CoinEnv"  # mixed rewards: the first update changes the weights


def two_steps(folder, base_dir, server: str = "", runner: str = "local", pushes: str = "", lora: bool = False,
              served_as: str = "tiny") -> list[dict]:  # fmt: skip
    """The micro-batches the loss saw in two steps of the real loop (synchronous: a push before each step);
    `pushes`: the folder the trainer writes its weight pushes to (the server's --weight-root); `lora`: a LoRA
    policy (AdamW at a large rate, so its first update moves the rollouts)."""
    cfg = tiny()
    cfg.out_dir, cfg.init_from, cfg.steps, cfg.runner = str(folder), str(base_dir), 2, runner
    if lora:
        cfg.lora.enabled, cfg.optim.muon, cfg.optim.lr = True, False, 5e-2
    o = cfg.agentic
    o.envs, o.asynchronous, o.rollout_server, o.server_model = [[COIN, 1.0]], False, server, served_as
    o.rollout_weights_dir = pushes
    model, optimizer = model_and_optimizer(cfg)
    return train_recording(cfg, model, optimizer, build(cfg, model, optimizer, str(base_dir)), folder / "agentic")


def train_recording(cfg, model, optimizer, data, stage_dir) -> list[dict]:
    """The real loop (cfg.steps steps) with the stage's loss; -> every micro-batch the loss was given."""
    loss_fn, batches = rl_loss(cfg.agentic), []

    def recording(model, batch, values):
        batches.append(batch)
        return loss_fn(model, batch, values)

    try:
        train(model=model, optimizer=optimizer, data=data, cfg=cfg, stage_dir=stage_dir, loss_fn=recording)
    finally:
        data.runner.close()
    return batches


def assert_same_rollouts(local: list[dict], remote: list[dict]) -> None:
    assert len(local) == len(remote) == 4  # 2 steps x grad_accum 2
    for a, b in zip(local, remote):
        assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["mask"], b["mask"])
        assert torch.equal(a["advantages"], b["advantages"])
        torch.testing.assert_close(a["rollout_logp"], b["rollout_logp"], atol=1e-5, rtol=1e-5)


def test_server_rollouts_with_weight_pushes_equal_in_process(tmp_path, base_dir):
    pushes = tmp_path / "pushes"
    pushes.mkdir()
    server = RunningServer(str(base_dir), prefix_cache_mb=16, enable_weight_updates=True, weight_root=str(pushes))
    try:
        local = two_steps(tmp_path / "local", base_dir)
        remote = two_steps(tmp_path / "remote", base_dir, server.url, pushes=str(pushes))
        version = httpx.get(server.url + "/get_weight_version").json()["weight_version"]
        bad_path = httpx.post(server.url + "/update_weights_from_disk", json={"model_path": str(pushes / "nope")})
        save_file({"embed.weight": torch.zeros(3, 3)}, pushes / "wrong.safetensors")
        wrong = httpx.post(server.url + "/update_weights_from_disk",
                           json={"model_path": str(pushes / "wrong.safetensors")})  # fmt: skip
        after = httpx.get(server.url + "/get_weight_version").json()["weight_version"]
    finally:
        server.stop()
    assert_same_rollouts(local, remote)
    assert version == after == 1  # pushed before step 0 (version 0) and step 1 (version 1)
    assert bad_path.status_code == 400 and "no such file" in bad_path.json()["error"]["message"]
    assert wrong.status_code == 400 and "does not match the served model" in wrong.json()["error"]["message"]
    # the check has teeth: the initial weights give the second step's tokens other log-probs
    initial = load_hf(base_dir, dtype=torch.float32)
    b = remote[2]
    with torch.no_grad():
        logp = token_logprobs(initial(b["input_ids"]).logits, b["targets"], 1.0)
    m = b["mask"] > 0
    assert (logp[m] - b["rollout_logp"][m]).abs().max() > 1e-4


def test_lora_policy_pushes_its_adapters_and_the_server_samples_with_them(tmp_path, base_dir):
    """agentic.server_lora=adapter (the default): the trainer pushes only its adapters, the server (--enable-lora)
    serves them beside its base under the rollout model's name; the two steps equal the in-process run's."""
    pushes = tmp_path / "pushes"
    pushes.mkdir()
    server = RunningServer(str(base_dir), enable_lora=True, enable_weight_updates=True, weight_root=str(pushes))
    try:
        local = two_steps(tmp_path / "local", base_dir, lora=True)
        remote = two_steps(tmp_path / "remote", base_dir, server.url, pushes=str(pushes), lora=True, served_as="policy")
        models = httpx.get(server.url + "/v1/models").json()["data"]
    finally:
        server.stop()
    assert_same_rollouts(local, remote)
    assert [(m["id"], m.get("parent")) for m in models] == [("tiny", None), ("policy", "tiny")]
    initial = load_hf(base_dir, dtype=torch.float32)  # the second step sampled from the updated adapters
    b = remote[2]
    with torch.no_grad():
        logp = token_logprobs(initial(b["input_ids"]).logits, b["targets"], 1.0)
    m = b["mask"] > 0
    assert (logp[m] - b["rollout_logp"][m]).abs().max() > 1e-4
