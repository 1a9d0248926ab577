"""The RL stage on the one loop (issue 17): engine log-probs == the trainer's, the first step's gradient == the hand
formula, resume == uninterrupted, a bf16 rollout engine shows in the mismatch figure, the CLI's bad input."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file

from glmstack.inference import Engine
from glmstack.model import GLM, ModelConfig
from glmstack.posttrain.rl.losses import token_logprobs
from glmstack.posttrain.rl.rollouts import Rollouts
from glmstack.posttrain.rl.stage import rl_loss, run_rl
from glmstack.posttrain.rl.tasks import make_task
from glmstack.recipes.rl_tiny import rl as tiny_rl


def tiny_model(seed: int = 0) -> GLM:
    model = GLM(ModelConfig.preset("tiny"), dtype=torch.float32)
    model.materialize("cpu")
    with torch.no_grad():
        for name, t in model.initial_tensors(seed=seed, device="cpu"):
            model.state_dict()[name].copy_(t)
    return model


def small_cfg(tmp_path, **rl):
    cfg = tiny_rl()
    cfg.out_dir, cfg.steps, cfg.seq_len = str(tmp_path), 2, 16
    base = {"samples_per_step": 8, "curriculum": [[0, 0, 4]], "max_new_tokens": 3, "heldout_n": 4, "eval_every": 0}
    cfg.rl = dataclasses.replace(cfg.rl, **(base | rl))
    return cfg


def rollouts(model, cfg) -> Rollouts:
    return Rollouts(model=model, task=make_task("toy"), opts=cfg.rl, seed=cfg.seed, micro_batches=cfg.grad_accum)


@pytest.mark.parametrize("temperature,top_p,top_k", [(0.8, 0.9, 0), (1.3, 1.0, 50), (0.0, 1.0, 0)])
def test_engine_logprobs_equal_teacher_forced(temperature, top_p, top_k):
    model = tiny_model()
    prompts = [[5, 9, 17], [3, 4]]
    res = Engine(model).generate(prompts, max_new_tokens=6, temperature=temperature, top_p=top_p, top_k=top_k,
                                 seeds=[1, 2], logprobs=True, stop_ids=[])  # fmt: skip
    for prompt, toks, lps in zip(prompts, res.tokens, res.logprobs):
        seq = torch.tensor([prompt + toks])
        with torch.no_grad():
            logits = model(seq[:, :-1]).logits
        want = token_logprobs(logits, seq[:, 1:], temperature or 1.0, top_p, top_k)[0, len(prompt) - 1 :]
        assert len(lps) == len(toks)
        torch.testing.assert_close(torch.tensor(lps), want, atol=1e-5, rtol=0)


def test_first_step_gradient_is_the_hand_formula(tmp_path):
    """On policy (logp == old == rollout up to float noise, mismatch none): loss = −mean_i A_i, and the gradient is
    −(1/N) Σ_i A_i (1/|y_i|) Σ_t ∇log π(y_it), each micro-batch weighted by its share (equal here)."""
    cfg = small_cfg(tmp_path, mismatch="none")
    model = tiny_model()
    batches = rollouts(model, cfg).make_step()
    assert len(batches) == cfg.grad_accum and {len(b["input_ids"]) for b in batches} == {len(batches[0]["input_ids"])}
    adv = torch.cat([b["advantages"] for b in batches])
    assert adv.abs().sum() > 0, "the seed should give at least one informative group"
    loss_fn = rl_loss(cfg.rl)
    model.zero_grad()
    for b in batches:
        loss, stats = loss_fn(model, b, {})
        torch.testing.assert_close(loss, -b["advantages"].mean(), atol=1e-6, rtol=0)
        (loss / len(batches)).backward()
        assert stats["mean_abs_logp_diff"] < 1e-5 and stats["clip_frac"] == 0.0
    got = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    hand = 0.0
    for b in batches:
        logp = torch.log_softmax(model(b["input_ids"]).logits / b["temperature"], -1)
        logp = logp.gather(-1, b["targets"][..., None])[..., 0]  # (B, T)
        per_sample = (logp * b["mask"]).sum(-1) / b["mask"].sum(-1)
        hand = hand - (b["advantages"] * per_sample).sum() / len(adv)
    hand.backward()
    for n, p in model.named_parameters():
        if n in got:
            torch.testing.assert_close(got[n], p.grad, atol=1e-6, rtol=1e-4)


def test_bf16_rollouts_show_in_the_mismatch_figure(tmp_path):
    model = tiny_model()
    diffs = {}
    for dtype in ("float32", "bfloat16"):
        cfg = small_cfg(tmp_path, rollout_dtype=dtype)
        batches = rollouts(model, cfg).make_step()
        with torch.no_grad():
            diffs[dtype] = max(rl_loss(cfg.rl)(model, b, {})[1]["mean_abs_logp_diff"] for b in batches)
    assert diffs["float32"] < 1e-5
    assert diffs["bfloat16"] > max(
        1e-4, 100 * diffs["float32"]
    )  # bf16 weights: the trainer's fp32 π_old differs from what the engine sampled with


@pytest.mark.parametrize("ppo", [{}, {"ppo_epochs": 2, "minibatches": 2},
                                 {"partial_rollouts": True, "partial_oversample": 1.0, "tau": 1,
                                  "dynamic_sampling": False}])  # fmt: skip
def test_resume_equals_uninterrupted(tmp_path, ppo):
    """Stopped after step 1 (with PPO-style updates: in the middle of a rollout batch; with partial rollouts: groups
    in flight) and resumed == one run."""
    steps = 3 if "ppo_epochs" in ppo else 2
    whole = small_cfg(tmp_path / "a", **ppo)
    whole.steps = steps
    run_rl(whole)
    part = small_cfg(tmp_path / "b", **ppo)
    part.steps = steps
    assert run_rl(part, stop_at=1)["stopped"] == "stop_at"
    result = run_rl(part)
    assert result["step"] == steps
    wa = load_file(tmp_path / f"a/tiny/rl/step_{steps:07d}/model.safetensors")
    wb = load_file(tmp_path / f"b/tiny/rl/step_{steps:07d}/model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    rows = [[json.loads(x) for x in (tmp_path / p / "tiny/rl/metrics.jsonl").read_text().splitlines()] for p in "ab"]
    assert [r.get("reward") for r in rows[0]] == [r.get("reward") for r in rows[1]]
    assert [r["loss"] for r in rows[0]] == [r["loss"] for r in rows[1]]
    summary = json.loads((tmp_path / "a/tiny/rl/rl_summary.json").read_text())
    assert summary["steps"] == steps and (tmp_path / "a/tiny/rl/plots/rl_mismatch.png").exists()
    from glmstack.posttrain.rl.dashboard import compare

    table = compare({"run": [str(tmp_path / p / "tiny/rl") for p in "ab"]}, str(tmp_path / "cmp.png"))
    assert "| run (2) | " in table and (tmp_path / "cmp_heldout.png").exists()


def test_ppo_epochs_and_minibatches(tmp_path):
    """2 epochs × 2 minibatches: 4 optimizer steps per rollout batch, each epoch visits every sample once, old_logp is
    the trainer at the rollout weights (== the fp32 engine's log-probs), and after an update the ratio moves off 1
    (the clipped surrogate becomes active) while the first update is the on-policy step."""
    cfg = small_cfg(tmp_path, ppo_epochs=2, minibatches=2, mismatch="none")
    model = tiny_model()
    data = rollouts(model, cfg)
    batches = data.make_step()
    assert len(batches) == 2 * 2 * cfg.grad_accum and data.step == 4
    per_epoch = len(batches) // 2
    epochs = [sorted(tuple(row.tolist()) for b in batches[e * per_epoch : (e + 1) * per_epoch] for row in b["input_ids"])
              for e in range(2)]  # fmt: skip
    assert len(epochs[0]) == cfg.rl.samples_per_step and epochs[0] == epochs[1]
    for b in batches:
        m = b["mask"] > 0
        torch.testing.assert_close(b["old_logp"][m], b["rollout_logp"][m], atol=1e-5, rtol=0)
    loss_fn = rl_loss(cfg.rl)
    opt = torch.optim.SGD(model.parameters(), lr=5.0)
    clip, kl = [], []
    for k in range(0, len(batches), cfg.grad_accum):
        opt.zero_grad()
        step_clip = 0.0
        for b in batches[k : k + cfg.grad_accum]:
            loss, stats = loss_fn(model, b, {})
            (loss / cfg.grad_accum).backward()
            step_clip += stats["clip_frac"] / cfg.grad_accum
            kl.append(stats["ppo_kl"]) if k == 0 else None
        if k == 0:
            torch.testing.assert_close(loss, -b["advantages"].mean(), atol=1e-5, rtol=0)
        clip.append(step_clip)
        opt.step()
    assert clip[0] == 0.0 and max(clip[1:]) > 0
    assert kl == [0.0] * cfg.grad_accum  # slime's invariant: the first update recomputes π_old bit for bit
    assert "reward" in batches[0]["stats"] and "reward" not in batches[cfg.grad_accum]["stats"]


def test_cli_bad_input_is_one_line(tmp_path, capsys):
    from glmstack.cli import main

    assert main(["rl", "rl_tiny", "--set", "rl.task=nope", "--set", f"out_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "rl.task" in err[0]
    assert main(["rl", "rl_tiny", "--set", "rl.samples_per_step=7", "--set", f"out_dir={tmp_path}"]) == 2


def test_dynamic_sampling_and_the_hard_stage_of_the_curriculum(tmp_path):
    """Step 0 keeps groups whose rewards differ (over-sampling refills); from step 1 the curriculum's hard stage
    keeps only groups whose first 2 samples fail and a later one succeeds (pass@2 = 0, pass@4 > 0)."""
    cfg = small_cfg(tmp_path, curriculum=[[0, 0, 4], [1, 0, 4, 2]], oversample_rounds=3, oversample=3)
    data = rollouts(tiny_model(), cfg)
    for step in range(2):
        batches = data.make_step()
        adv = torch.cat([b["advantages"] for b in batches]).view(-1, 4)
        stats = batches[0]["stats"]
        assert stats["kept_informative"] == float((adv.abs().sum(1) > 0).float().mean())
        for g in adv[adv.abs().sum(1) > 0]:
            if step == 1:  # binary rewards: the two failures are the group's lowest advantages
                assert g[0] == g[1] == g.min() < g.max()
    assert stats["kept_informative"] > 0


def test_dynamic_temperature_sweeps_on_a_plateau(tmp_path):
    """A plateau (window 1, any change below 10) triggers the held-out sweep; the chosen temperature is what the
    step's rollouts and the trainer's log-probs use, and it survives a state_dict round trip."""
    cfg = small_cfg(tmp_path, dynamic_temperature=True, plateau_window=1, plateau_tol=10.0, temperatures=[1.0, 1.7])
    data = rollouts(tiny_model(), cfg)
    data.make_step(), data.make_step()
    assert data.temperature == 1.0 and len(data.history) == 2
    batches = data.make_step()  # two rewards in the history: a plateau -> sweep -> history restarts
    assert data.temperature in (1.0, 1.7) and len(data.history) == 1
    assert all(b["temperature"] == data.temperature == b["stats"]["temperature"] for b in batches)
    again = rollouts(tiny_model(), cfg)
    again.load_state_dict(data.state_dict())
    assert again.state_dict() == data.state_dict()


def test_sync_every_pushes_every_k_steps_and_counts_staleness_in_steps(tmp_path):
    """rl.sync_every=2: the rollout engine takes the trainer's weights at steps 0 and 2 only, so step 1's rollouts
    come from step 0's weights (1 step stale) and the engine's copy then differs from the trainer's."""
    from glmstack.cli import main

    args = ["rl", "rl_tiny", "--set", f"out_dir={tmp_path}", "--set", "steps=3", "--set", "rl.eval_every=0",
            "--set", "rl.sync_every=2", "--set", "rl.tau=1", "--set", "log.plots=false"]  # fmt: skip
    assert main(args) == 0
    rows = [json.loads(x) for x in (tmp_path / "tiny" / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert [r["weight_version"] for r in rows] == [0.0, 0.0, 2.0]
    assert [r["staleness_max"] for r in rows] == [0.0, 1.0, 0.0]
    assert main([*args[:-4], "--set", "rl.sync_every=2", "--set", "rl.tau=0"]) == 2  # every step-1 rollout too old
