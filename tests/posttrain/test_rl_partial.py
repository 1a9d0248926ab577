"""rl.partial_rollouts (issue 41, partial.py): over-sampled groups, generation stopped once the batch's groups are
complete, the unfinished rows continued first at the next step. Nothing aborted (partial_oversample=0) is the plain
path bit for bit; aborted rows come back as a prefix of what they would have generated, are resumed with the rest of
their budget, carry each segment's weight version and stay within rl.tau."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from glmstack.config import ConfigError
from glmstack.inference import Engine
from glmstack.posttrain.rl.stage import check, run_rl
from tests.posttrain.test_rl_stage import rollouts, small_cfg, tiny_model


def stop_happy(model, stop: int = 1):
    """The toy task's stop token made likely in some contexts, so response lengths vary (a length tail)."""
    with torch.no_grad():
        model.lm_head.weight[stop] = 6 * model.lm_head.weight[5]
    return model


def test_engine_budgets_and_stop_when():
    model = stop_happy(tiny_model())
    prompts = [[5, 9, 17], [3, 4], [8, 8, 8, 2]]
    full = Engine(model).generate(prompts, 12, temperature=1.0, seeds=[1, 2, 3], logprobs=True, stop_ids=[])
    short = Engine(model).generate(prompts, 12, temperature=1.0, seeds=[1, 2, 3], logprobs=True, stop_ids=[],
                                   budgets=[3, 12, 5])  # fmt: skip
    assert [len(t) for t in short.tokens] == [3, 12, 5] and short.finish_reason == ["length"] * 3
    cut = Engine(model).generate(prompts, 12, temperature=1.0, seeds=[1, 2, 3], logprobs=True, stop_ids=[],
                                 stop_when=lambda finish: sum(f is not None for f in finish) >= 1, budgets=[4, 12, 12])
    assert cut.finish_reason == ["length", "abort", "abort"]
    for a, b, la, lb in zip(cut.tokens, full.tokens, cut.logprobs, full.logprobs):
        assert a == b[: len(a)] and la == lb[: len(a)]  # an aborted row is a prefix of its whole generation


def run(tmp_path, name, **rl):
    cfg = small_cfg(tmp_path / name, dynamic_sampling=False, max_new_tokens=12, **rl)
    cfg.steps = 3
    assert run_rl(cfg)["stopped"] == "done"
    return [json.loads(x) for x in next((tmp_path / name).rglob("metrics.jsonl")).read_text().splitlines()]


def test_nothing_aborted_is_the_plain_path_bit_for_bit(tmp_path):
    plain = run(tmp_path, "plain")
    partial = run(tmp_path, "partial", partial_rollouts=True, partial_oversample=0.0)
    for a, b in zip(plain, partial):
        assert (a["loss"], a["grad_norm"], a["reward"]) == (b["loss"], b["grad_norm"], b["reward"])
    assert all(r["partial/aborted_rows"] == 0 for r in partial)


def test_aborted_rows_resume_with_their_versions_within_tau(tmp_path):
    cfg = small_cfg(tmp_path, dynamic_sampling=False, max_new_tokens=12, partial_rollouts=True,
                    partial_oversample=1.0, tau=1)  # fmt: skip
    ro = rollouts(stop_happy(tiny_model()), cfg)
    aborted = resumed = 0
    for _ in range(4):
        micro = ro.make_step()
        stats = micro[0]["stats"]
        aborted += stats["partial/aborted_rows"]
        resumed += stats["partial/resumed_rows"]
        assert stats["staleness_max"] <= cfg.rl.tau and len(micro) == cfg.grad_accum
        for g in ro.pending:
            for r in g["rows"]:
                assert len(r["tokens"]) == len(r["logprobs"]) == len(r["versions"]) <= cfg.rl.max_new_tokens
    assert aborted > 0 and resumed > 0


@pytest.mark.parametrize("setting", [{"dynamic_sampling": True}, {"tau": 0}, {"partial_oversample": -1.0}])
def test_unsupported_settings_are_refused(tmp_path, setting):
    cfg = small_cfg(tmp_path, partial_rollouts=True, **({"dynamic_sampling": False, "tau": 1} | setting))
    with pytest.raises(ConfigError, match="partial"):
        check(dataclasses.replace(cfg))
