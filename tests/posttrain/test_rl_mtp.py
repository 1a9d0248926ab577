"""rl.mtp_weight (issue 41): the MTP layer trained on the policy's own rollout tokens during RL. Detached (the
default) the MTP loss reaches the MTP layer only — every other gradient is the RL objective's, bit for bit; not
detached it reaches the trunk too. The acceptance length of MTP speculative decoding and whether its output equals
plain greedy are measured at every held-out evaluation and at the end (rl_summary.json)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from glmstack.posttrain.rl.stage import rl_loss, run_rl
from tests.posttrain.test_rl_stage import rollouts, small_cfg, tiny_model


def grads(model, batch, opts):
    model.zero_grad()
    loss, stats = rl_loss(opts)(model, batch, {})
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, stats


@pytest.mark.parametrize("detach", [True, False])
def test_the_mtp_loss_trains_the_mtp_layer_and_reaches_the_trunk_only_undetached(tmp_path, detach):
    cfg = small_cfg(tmp_path, mismatch="none")
    model = tiny_model()
    batch = rollouts(model, cfg).make_step()[0]
    plain, _ = grads(model, batch, cfg.rl)
    with_mtp, stats = grads(model, batch, dataclasses.replace(cfg.rl, mtp_weight=0.5, mtp_detach_trunk=detach))
    assert stats["mtp_loss"] > 0
    mtp = {n for n in with_mtp if n.startswith("mtp.")}
    assert mtp and not {n for n in plain if n.startswith("mtp.")}  # RL alone leaves the MTP layer untouched
    assert all(with_mtp[n].abs().sum() > 0 for n in mtp if "norm" in n or "eh_proj" in n)
    policy = [n for n in plain if not n.startswith("mtp.")]
    same = [torch.equal(with_mtp[n], plain[n]) for n in policy]
    if detach:  # trunk, embedding and LM head: the RL gradient exactly
        assert all(same)
    else:
        assert not all(same) and not torch.equal(with_mtp["lm_head.weight"], plain["lm_head.weight"])


def test_rl_run_tracks_the_mtp_acceptance_length(tmp_path):
    cfg = small_cfg(tmp_path, mtp_weight=0.3, max_new_tokens=8, eval_every=2)
    cfg.steps = 3
    assert run_rl(cfg)["stopped"] == "done"
    rows = [json.loads(x) for x in next(tmp_path.rglob("metrics.jsonl")).read_text().splitlines()]
    evals = [r for r in rows if "mtp_accept_len" in r]
    assert [r["step"] for r in evals] == [1, 3] and all(r["mtp_accept_len"] >= 1.0 for r in evals)
    assert all(r["spec_equals_greedy"] == 1.0 for r in evals) and all(r["mtp_loss"] > 0 for r in rows)
    summary = json.loads(next(tmp_path.rglob("rl_summary.json")).read_text())
    assert summary["mtp_accept_len_start"] == evals[0]["mtp_accept_len"] and summary["mtp_accept_len_end"] >= 1.0
