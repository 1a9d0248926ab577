"""`glmstack rl rl_tiny --set rl.loss=ppo` end to end (issue 39's PPO half): the critic's figures reach metrics.jsonl
and the value loss falls, the first update is on-policy bit for bit (ratio and values), the value head trains with
the policy but stays out of the HF folder, kill/resume == uninterrupted, unsupported options are one line."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math

import torch
from safetensors.torch import load_file

from glmstack.cli import main
from glmstack.posttrain.rl.ppo import attach_value_head
from glmstack.posttrain.rl.rollouts import Rollouts
from glmstack.posttrain.rl.stage import reference, rl_loss
from glmstack.posttrain.rl.tasks import make_task
from glmstack.recipes.rl_tiny import rl as tiny_rl
from glmstack.train.stage import initial_model

PPO_FIGURES = ("value_loss", "kl", "clip_frac", "vf_clip_frac", "returns_mean", "values_mean")
# a small PPO run: 8 rollouts of <= 3 tokens per step, no held-out evaluation in between
SMALL = ["rl.loss=ppo", "rl.samples_per_step=8", "rl.max_new_tokens=3", "rl.heldout_n=4", "rl.eval_every=0"]


def cli(tmp_path, *sets: str, extra=()) -> int:
    args = [a for s in SMALL + list(sets) + [f"out_dir={tmp_path}"] for a in ("--set", s)]
    return main(["rl", "rl_tiny", *args, *extra])


def rows(tmp_path) -> list[dict]:
    return [json.loads(x) for x in (tmp_path / "tiny/rl/metrics.jsonl").read_text().splitlines()]


def test_ppo_run_reports_the_critic_and_the_value_loss_falls(tmp_path):
    """8 steps on rl_tiny's curriculum (group size 4), 4 PPO epochs per rollout batch (2 rollout batches): every
    PPO figure present and finite (explained variance once per rollout batch, with its first step), the value loss
    falling at every epoch over the same rollouts (the critic fits them), the KL to the reference exactly 0 on the
    first batch (the policy is the reference at step 0) and off 0 on the second."""
    assert cli(tmp_path, "steps=8", "rl.ppo_epochs=4", "rl.vf_coef=1.0", "optim.lr=3e-4") == 0
    got = rows(tmp_path)
    assert len(got) == 8
    for i, r in enumerate(got):
        want = PPO_FIGURES + ("loss", "policy_loss") + (("explained_variance", "reward") if i % 4 == 0 else ())
        assert all(k in r and math.isfinite(r[k]) for k in want), r
    for batch in (got[:4], got[4:]):
        vl = [r["value_loss"] for r in batch]
        assert all(b < a for a, b in itertools.pairwise(vl)), vl
    assert [r["kl"] for r in got[:4]] == [0.0] * 4 and got[4]["kl"] != 0.0
    assert (tmp_path / "tiny/rl/rl_summary.json").exists()
    assert all((tmp_path / "tiny/rl/plots" / f"{name}.png").exists() for name in ("rl_ppo_value", "rl_ppo_kl"))


def small_cfg(tmp_path, **rl):
    cfg = tiny_rl()
    cfg.out_dir, cfg.steps = str(tmp_path), 2
    base = {"loss": "ppo", "samples_per_step": 8, "max_new_tokens": 3, "heldout_n": 4, "eval_every": 0}
    cfg.rl = dataclasses.replace(cfg.rl, **(base | rl))
    return cfg


def test_first_update_is_on_policy_and_the_value_head_trains_with_the_policy(tmp_path):
    cfg = small_cfg(tmp_path, mismatch="none")
    model = initial_model(cfg, torch.device("cpu"))
    optimizer = attach_value_head(model, cfg.optim, cfg.seed)
    head = model.value_head
    assert any(p is head.weight for g in optimizer.param_groups for p in g["params"])
    data = Rollouts(model=model, task=make_task("toy"), opts=cfg.rl, seed=cfg.seed, micro_batches=cfg.grad_accum,
                    reference=reference(cfg))  # fmt: skip
    batches = data.make_step()
    loss_fn = rl_loss(cfg.rl)
    for b in batches:
        assert b["advantages"].shape == b["mask"].shape and b["kl"].abs().max() < 1e-6  # policy == reference
        loss, stats = loss_fn(model, b, {})
        assert stats["ppo_kl"] == 0.0 and stats["clip_frac"] == 0.0 and stats["vf_clip_frac"] == 0.0
        m = b["mask"] > 0
        with torch.no_grad():  # the critic's values in the loss == the rollout hook's, bit for bit
            out = model(b["input_ids"])
        assert torch.equal(head(out.hidden).squeeze(-1)[m], b["values"][m])
        loss.backward()
    assert head.weight.grad is not None and head.weight.grad.abs().sum() > 0


def test_ppo_resume_equals_uninterrupted(tmp_path):
    """`--stop-at 1` then `--resume auto` == one 3-step run: the policy's weights, every metric (the value loss
    depends on the resumed value head and its optimizer state, kept in trainer_state/dcp), and the HF folder has
    no value head."""
    assert cli(tmp_path / "a", "steps=3") == 0
    assert cli(tmp_path / "b", "steps=3", extra=["--stop-at", "1"]) == 0
    assert cli(tmp_path / "b", "steps=3", extra=["--resume", "auto"]) == 0
    wa = load_file(tmp_path / "a/tiny/rl/step_0000003/model.safetensors")
    wb = load_file(tmp_path / "b/tiny/rl/step_0000003/model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert not any("value_head" in k for k in wa)
    ra, rb = rows(tmp_path / "a"), rows(tmp_path / "b")
    assert len(ra) == len(rb) == 3
    for k in ("loss", "explained_variance") + PPO_FIGURES:
        assert [r[k] for r in ra] == [r[k] for r in rb], k


def test_unsupported_ppo_options_are_one_line(tmp_path, capsys):
    assert cli(tmp_path, "rl.rollout_server=http://localhost:1") == 2
    assert cli(tmp_path, "rl.gae_lambda=1.5") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "rl.rollout_server" in err[0] and "rl.gae_lambda" in err[1]


def test_ppo_options_on_another_loss_are_refused(tmp_path, capsys):
    """rl.kl_coef and the critic's options do nothing without the critic: refused on grpo, never ignored."""
    assert cli(tmp_path, "rl.loss=grpo", "rl.kl_coef=0.1", "rl.vf_coef=0.5") == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "rl.kl_coef, rl.vf_coef: PPO's options" in err and "rl.loss=grpo" in err
