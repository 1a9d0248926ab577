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


def test_partial_rollouts_on_a_rollout_server(tmp_path, base_dir):
    """rl.partial_rollouts with rl.rollout_server: the rows are streamed and the open streams closed once the groups
    are complete (the server cancels those jobs); aborted rows come back with the tokens, log-probs and version they
    had and resume next step within tau. Nothing aborted (oversample 0) equals the server's plain path."""
    import shutil

    from glmstack.model import save_hf
    from glmstack.posttrain.rl.remote import ServerEngine
    from tests.serve_fixture import RunningServer

    folder = tmp_path / "model"
    save_hf(stop_happy(tiny_model()), folder)
    for f in base_dir.glob("tokenizer*"):
        shutil.copy(f, folder / f.name)
    server = RunningServer(str(folder), enable_weight_updates=True, weight_root=str(tmp_path))
    try:
        # the client's contract first: an aborted row is a prefix of its whole generation, log-probs included
        engine, prompts = ServerEngine(server.url, "tiny"), [[5, 9, 17], [3, 4], [8, 8, 8, 2]]
        full = engine.generate(prompts, 12, temperature=1.0, seeds=[1, 2, 3], stop_ids=[])
        cut = engine.generate(prompts, 12, temperature=1.0, seeds=[1, 2, 3], stop_ids=[], budgets=[2, 12, 12],
                              stop_when=lambda finish: finish[0] is not None)  # fmt: skip
        assert cut.finish_reason[0] == "length" and len(cut.tokens[0]) == 2
        for a, b, la, lb in zip(cut.tokens, full.tokens, cut.logprobs, full.logprobs):
            assert a == b[: len(a)] and la == pytest.approx(lb[: len(a)], abs=1e-5)
        served = {"rollout_server": server.url, "server_model": "tiny", "rollout_weights_dir": str(tmp_path)}
        first = {}
        for name, rl in (("plain", {}), ("partial0", {"partial_rollouts": True, "partial_oversample": 0.0})):
            cfg = small_cfg(tmp_path / name, dynamic_sampling=False, max_new_tokens=12, **served, **rl)
            first[name] = rollouts(stop_happy(tiny_model()), cfg).make_step()
        for a, b in zip(first["plain"], first["partial0"]):
            assert torch.equal(a["input_ids"], b["input_ids"])
            torch.testing.assert_close(a["rollout_logp"], b["rollout_logp"], atol=1e-5, rtol=0)
        # long budgets: the server decodes while the client notices the groups are complete and closes the streams
        cfg = small_cfg(tmp_path / "partial", dynamic_sampling=False, max_new_tokens=48, partial_rollouts=True,
                        partial_oversample=1.0, tau=1, **served)  # fmt: skip
        cfg.seq_len = 64
        ro = rollouts(stop_happy(tiny_model()), cfg)
        aborted = resumed = 0
        for _ in range(4):
            stats = ro.make_step()[0]["stats"]
            aborted += stats["partial/aborted_rows"]
            resumed += stats["partial/resumed_rows"]
            assert stats["staleness_max"] <= cfg.rl.tau
            for g in ro.pending:
                for r in g["rows"]:
                    assert len(r["tokens"]) == len(r["logprobs"]) == len(r["versions"]) <= cfg.rl.max_new_tokens
        assert aborted > 0 and resumed > 0
    finally:
        server.stop()
    assert server.sched.stats["aborted"] > 0  # the closed streams' jobs were cancelled on the server
