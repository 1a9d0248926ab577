"""Routing replay (R3, posttrain/rl/replay.py): the trainer routes each token as the rollout engine did, in process
and through the server (`return_routed_experts` -> `routed_experts`), and `glmstack rl` reports the routing figures."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from glmstack.model import GLM, ModelConfig, load_hf
from glmstack.posttrain.rl.rollouts import Rollouts
from glmstack.posttrain.rl.stage import RLOptions, rl_loss
from glmstack.posttrain.rl.tasks import make_task
from tests.posttrain.test_rl_stage import rollouts, small_cfg
from tests.serve_fixture import RunningServer

FIGURES = ("routing_diff_frac", "routing_layer_diff_frac")


def test_replay_routes_the_trainer_as_the_perturbed_rollout_and_shrinks_the_logp_gap(tmp_path):
    """A rollout copy with noise on its weights routes some tokens elsewhere (routing_diff_frac > 0). Replaying its
    record makes every trunk MoE layer of the trainer route each token to the recorded experts (its expert load is
    the record's count) and brings the trainer's log-probs closer to the sampler's."""
    # weights at 0.1 (not 0.02): experts large enough that a flipped expert moves the logits, as in a trained model
    model = GLM(ModelConfig.preset("tiny", initializer_range=0.1)).init_weights(seed=0)
    cfg = small_cfg(tmp_path, rollout_noise=0.01, routing_replay="record", max_new_tokens=8, samples_per_step=16)
    batches = rollouts(model, cfg).make_step()
    gap = {}
    for mode in ("record", "replay"):
        loss_fn = rl_loss(dataclasses.replace(cfg.rl, routing_replay=mode))
        with torch.no_grad():
            stats = [loss_fn(model, b, {})[1] for b in batches]
        assert all(s["routing_diff_frac"] > 0 for s in stats)  # the perturbation flipped experts: a real test
        gap[mode] = sum(s["mean_abs_logp_diff"] for s in stats) / len(stats)
    assert gap["replay"] < 0.8 * gap["record"], gap
    n_layers = batches[0]["routes"].shape[2]
    rerouted = 0
    for b in batches:
        for i in range(b["input_ids"].shape[0]):
            n = int((b["routes"][i, :, 0, 0] >= 0).sum())  # the row's input tokens (the rest is padding)
            ids, routes = b["input_ids"][i : i + 1, :n], b["routes"][i : i + 1, :n]
            with torch.no_grad():
                replayed, own = model(ids, routes=routes, return_routes=True), model(ids, return_routes=True)
            want = torch.stack([torch.bincount(routes[0, :, l].flatten(), minlength=model.cfg.n_routed_experts)
                                for l in range(n_layers)]).float()  # fmt: skip
            assert torch.equal(replayed.expert_load[:n_layers], want)
            assert torch.equal(replayed.routes, own.routes) or not torch.equal(own.expert_load[:n_layers], want)
            rerouted += not torch.equal(own.expert_load[:n_layers], want)
    assert rerouted > 0


def test_routing_replay_needs_moe_layers_and_plain_decoding(tmp_path):
    from glmstack.config import ConfigError
    from glmstack.inference import Engine

    dense = GLM(ModelConfig.preset("tiny", first_k_dense_replace=3)).init_weights(seed=0)
    with pytest.raises(ConfigError, match="no MoE layer"):
        rollouts(dense, small_cfg(tmp_path, routing_replay="record"))
    moe = GLM(ModelConfig.preset("tiny")).init_weights(seed=0)
    with pytest.raises(ValueError, match="speculative"):
        Engine(moe).generate([[5, 9]], max_new_tokens=4, speculative="mtp", return_routes=True)


def test_routing_replay_is_refused_for_vision_language_rl():
    from glmstack.config import ConfigError
    from glmstack.multimodal.rl import check
    from glmstack.recipes.vl_tiny import rl as vl_rl

    cfg = vl_rl()
    cfg.init_from = "x"
    cfg.rl = dataclasses.replace(cfg.rl, routing_replay="replay")
    with pytest.raises(ConfigError, match="routing_replay"):
        check(cfg)


def test_server_returns_routed_experts_through_the_openai_client(base_dir, tmp_path):
    """`return_routed_experts` through the official client (completions with n=2, and chat): each choice's
    `routed_experts` is int16 [seq_len - 1, MoE layers, top_k], the routing a full forward of the served model
    computes over that choice's tokens, also when the prompt's prefix is in the prefix cache. In-process and
    server rollouts then carry the same routes in the trained batch."""
    from openai import OpenAI

    from glmstack.inference.routes import decode_routes

    model = load_hf(str(base_dir))
    server = RunningServer(str(base_dir), prefix_cache_mb=64, prefix_block=2, enable_weight_updates=True,
                           weight_root=str(tmp_path))  # fmt: skip
    try:
        client = OpenAI(base_url=server.url + "/v1", api_key="none")
        prompt = [5, 9, 17, 3, 44, 8, 100]
        for _ in range(2):  # the second time the prompt's blocks are cached: routes still cover the whole prompt
            r = client.completions.create(
                model="tiny",
                prompt=prompt,
                max_tokens=5,
                temperature=1.0,
                seed=3,
                n=2,
                extra_body={"return_routed_experts": True, "return_token_ids": True},
            )
            for c in r.choices:
                got = c.model_extra["routed_experts"]
                ids = prompt + c.model_extra["token_ids"]
                assert got["dtype"] == "int16" and got["shape"] == [len(ids) - 1, 2, model.cfg.num_experts_per_tok]
                with torch.no_grad():
                    want = model(torch.tensor([ids[:-1]]), return_routes=True).routes[0]
                assert torch.equal(decode_routes(got).long().sort(-1).values, want.sort(-1).values)
            assert r.usage.prompt_tokens_details.cached_tokens == 0  # computed whole: the cache keeps no routes
        chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                                              extra_body={"return_routed_experts": True})  # fmt: skip
        assert chat.choices[0].model_extra["routed_experts"]["shape"][1:] == [2, model.cfg.num_experts_per_tok]
        plain = client.completions.create(model="tiny", prompt=prompt, max_tokens=2)
        assert "routed_experts" not in plain.choices[0].model_extra
        assert plain.usage.prompt_tokens_details.cached_tokens > 0  # ... though it holds the prompt's blocks
        opts = RLOptions(task="toy", samples_per_step=8, curriculum=[[0, 0, 4]], max_new_tokens=4, heldout_n=2,
                         eval_every=0, routing_replay="replay")  # fmt: skip
        remote = dataclasses.replace(opts, rollout_server=server.url, server_model="tiny",
                                     rollout_weights_dir=str(tmp_path))  # fmt: skip
        local, served = [Rollouts(model=model, task=make_task("toy"), opts=o, seed=0, micro_batches=1).make_step()[0]
                         for o in (opts, remote)]  # fmt: skip
    finally:
        server.stop()
    assert torch.equal(local["input_ids"], served["input_ids"])
    assert torch.equal(local["routes"].sort(-1).values, served["routes"].sort(-1).values)


def test_glmstack_rl_replays_routes_in_process_and_from_the_server(tmp_path, base_dir):
    """`glmstack rl rl_tiny --set rl.routing_replay=replay` for 2 steps, rollouts in process and on a server: every
    step reports finite routing figures in [0, 1]; the server run's routes can only be the server's (it has no
    engine of its own), and they train the same steps as the in-process engine's."""
    from tests.serve_fixture import rl_here_and_on_server

    common = ["--set", f"init_from={base_dir}", "--set", "steps=2", "--set", "rl.eval_every=0", "--set",
              "rl.heldout_n=2", "--set", "log.plots=false", "--set", "schedule.warmup_steps=0", "--set",
              "rl.routing_replay=replay"]  # fmt: skip
    rows, _, _ = rl_here_and_on_server("rl_tiny", "rl", base_dir, tmp_path, common)
    for where in ("local", "remote"):
        assert len(rows[where]) == 2
        for row in rows[where]:
            assert all(math.isfinite(row[k]) and 0.0 <= row[k] <= 1.0 for k in FIGURES), row
    for a, b in zip(rows["local"], rows["remote"]):
        assert abs(a["grad_norm"] - b["grad_norm"]) <= 1e-4 * a["grad_norm"]
        assert all(abs(a[k] - b[k]) <= 1e-9 for k in FIGURES)


def test_agentic_trajectories_carry_the_latest_turns_routes_into_the_loss(tmp_path, base_dir):
    """Agentic RL with agentic.episode.routing_replay=replay: each trajectory keeps the routes its latest turn's engine
    computed for its whole context (a full forward's over those tokens), collate aligns them with input_ids and the
    loss reports the routing figures."""
    from glmstack.posttrain.agentic.stage import build
    from glmstack.recipes.agentic_tiny import agentic as tiny
    from glmstack.train.stage import model_and_optimizer

    cfg = tiny()
    cfg.out_dir, cfg.init_from, cfg.agentic.envs = str(tmp_path), str(base_dir), [["roles", 1.0]]
    cfg.agentic.episode = dataclasses.replace(cfg.agentic.episode, routing_replay="replay", temperature=1.5,
                                              max_new_tokens=24)  # fmt: skip
    model, optimizer = model_and_optimizer(cfg)
    data = build(cfg, model, optimizer, str(base_dir))
    try:
        batches = data.make_step()
    finally:
        data.runner.close()
    flat = [t for g in data.last_groups for t in g]
    assert any(t.turns == 2 for t in flat), "some episode should take a second turn (its routes re-cover turn 1)"
    for t in flat:
        n = t.routes.shape[0]
        assert n < len(t.ids) and all(k - 1 < n for k, m in enumerate(t.mask) if m)  # every trained target's input
        with torch.no_grad():
            want = model(torch.tensor([t.ids[:n]]), return_routes=True).routes[0]
        assert torch.equal(t.routes.long().sort(-1).values, want.sort(-1).values)
    stats = rl_loss(cfg.agentic)(model, batches[0], {})[1]
    assert all(math.isfinite(stats[k]) for k in FIGURES) and batches[0]["routes"].shape[2:] == (2, 2)
