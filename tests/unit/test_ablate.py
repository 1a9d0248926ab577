"""`glmstack ablate` (issue 20): intervals and verdicts, the claims' declarations, a tiny claim end to end through
the CLI (two seeds, seconds), and resume after a crash (finished (claim, arm, seed) results are not redone)."""

from __future__ import annotations

import itertools
import json
import math

import pytest
import torch

from glmstack.ablate import claim as claims_mod
from glmstack.ablate import runner
from glmstack.ablate.claim import Check, Claim, Stage
from glmstack.ablate.cli import main
from glmstack.ablate.measure import val_loss
from glmstack.ablate.stats import t_interval, verdict
from glmstack.cli import main as glmstack_main


def test_t_interval_matches_the_textbook_values():
    mean, low, high = t_interval([1.0, 2.0, 3.0])  # sd 1, n 3: half-width t_{0.975,2} / sqrt(3) = 4.303 / 1.732
    assert mean == 2.0 and high - mean == pytest.approx(4.303 / math.sqrt(3), rel=1e-6) and low == 4 - high
    scipy = pytest.importorskip("scipy.stats")
    vals = [0.3, -0.1, 0.5, 0.2, 0.4, 0.1]
    ref = scipy.t.interval(0.95, len(vals) - 1, loc=sum(vals) / 6, scale=scipy.sem(vals))
    assert t_interval(vals)[1:] == pytest.approx(ref, abs=1e-4)  # t to 3 decimals
    assert t_interval([1.0])[1:] == (-math.inf, math.inf)


@pytest.mark.parametrize("kind,better,low,high,margin,expected", [
    ("better", "lower", -0.3, -0.1, 0, "reproduced"),  # the treatment's loss is lower on every plausible value
    ("better", "lower", 0.1, 0.3, 0, "not reproduced"),
    ("better", "lower", -0.1, 0.1, 0, "inconclusive"),
    ("better", "higher", 0.05, 0.2, 0, "reproduced"),
    ("better", "higher", -0.05, 0.005, 0.01, "not reproduced"),  # at most a negligible gain
    ("no_worse", "lower", -0.01, 0.005, 0.01, "reproduced"),  # worse by less than the margin at most
    ("no_worse", "lower", 0.02, 0.05, 0.01, "not reproduced"),
    ("no_worse", "lower", 0.0, 0.02, 0.01, "inconclusive"),
    ("above", "higher", 0.6, 0.8, 0.5, "reproduced"),
    ("above", "higher", 0.1, 0.3, 0.5, "not reproduced"),
])
def test_verdicts(kind, better, low, high, margin, expected):
    assert verdict(kind, better, low, high, margin) == expected


def test_every_claim_of_the_issue_is_declared_with_valid_overrides():
    from glmstack.ablate.runner import stage_config

    names = claims_mod.names()
    issue_20 = {"depth_heads", "qk_norm", "mtp", "muon", "loss_free_balance", "cosine_wsd", "fim", "packing",
                "dsa_warmup", "icepop"}
    assert set(claims_mod.default_names()) == issue_20  # the default set; issue 21's two run when named
    assert {"blank_infilling", "stabilisers"} <= set(names)
    for name in names:
        c = claims_mod.load(name)
        assert c.checks and len(c.arms) >= 2
        for stage in c.stage_table().values():  # every override is a real config key (unknown keys raise)
            stage_config(stage, seed=0, steps=10, out_dir=runner.Path("/nonexistent"),
                         init_from="seed0/pre_10" if stage.init_from else "", data=runner.Path("/nonexistent"))


def test_the_gpu_recipe_replaces_the_base_of_every_ablate_stage():
    from glmstack.ablate.cli import selected
    from glmstack.ablate.runner import stage_config

    (muon,) = selected(["muon"], "ablate_gpu")
    cfg = stage_config(muon.arms["adamw"][0], seed=1, steps=30, out_dir=runner.Path("/nonexistent"))
    assert cfg.model_overrides["hidden_size"] == 256 and cfg.micro_batch_size == 64 and cfg.optim.muon is False
    assert cfg.steps == cfg.schedule.total_steps == 30 and cfg.schedule.warmup_steps == 3 and cfg.seed == 1


def test_deep_and_wide_arms_have_equal_active_parameters():
    from glmstack.ablate.claims import depth_heads
    from glmstack.config import apply_overrides
    from glmstack.model import GLM, ModelConfig
    from glmstack.recipes.ablate import pretrain

    counts = {}
    for arm, over in depth_heads.ARMS.items():
        cfg = apply_overrides(pretrain(), [f"{k}={json.dumps(v)}" for k, v in over.items()])
        with torch.device("meta"):
            model = GLM(ModelConfig.preset(cfg.model, **cfg.model_overrides, num_nextn_predict_layers=0))
        counts[arm] = model.num_params(active=True, include_embeddings=False)
    assert max(counts.values()) / min(counts.values()) < 1.02, counts


def test_tiny_claim_runs_end_to_end_with_two_seeds(tmp_path, capsys):
    out = tmp_path / "abl"
    assert glmstack_main(["ablate", "cosine_wsd", "--seeds", "2", "--scale", "0", "--out", str(out)]) == 0
    md = (out / "ablations.md").read_text()
    assert "| cosine_wsd | val_loss" in md and "glmstack ablate cosine_wsd --seeds 2" in md
    raw = json.loads((out / "results.json").read_text())
    (row,) = raw["checks"]
    assert row["n"] == 2 and row["low"] <= row["effect"] <= row["high"]
    assert row["verdict"] in ("reproduced", "not reproduced", "inconclusive")
    assert (out / "plots" / "cosine_wsd.png").stat().st_size > 1000
    assert not (out / "runs" / "cosine_wsd" / "seed0").exists()  # measured runs are deleted unless --keep-runs


def _claim(measure) -> Claim:
    return Claim(name="test_claim", source="test", statement="muon vs adamw",
                 arms={"a": [Stage(name="a", recipe="ablate", steps=8)],
                       "b": [Stage(name="b", recipe="ablate", overrides={"optim.muon": False}, steps=8)]},
                 measure=measure, checks=[Check(metric="val_loss", treatment="a", control="b")])


def test_a_crashed_set_resumes_without_redoing_finished_results(tmp_path):
    out = tmp_path / "abl"
    plan = runner.make_plan([_claim(val_loss)], 2, None, 0.0)
    calls = []

    def crashing(run):
        calls.append((run.arm, run.seed))
        if (run.arm, run.seed) == ("b", 1):
            raise RuntimeError("killed")
        return {"val_loss": val_loss(run)}

    with pytest.raises(RuntimeError, match="killed"):
        runner.run_all([_claim(crashing)], plan, out, say=lambda line: None)
    assert calls == [("a", 0), ("b", 0), ("a", 1), ("b", 1)]
    before = {p: p.stat().st_mtime_ns for p in (out / "results").rglob("*.json")}
    assert len(before) == 3
    calls.clear()
    def counting(run):
        calls.append((run.arm, run.seed))
        return {"val_loss": val_loss(run)}

    table = runner.run_all([_claim(counting)], plan, out, say=lambda line: None)
    assert calls == [("b", 1)]  # only the missing one ran
    assert {p: p.stat().st_mtime_ns for p in before} == before
    assert [len(v) for v in table["test_claim"].values()] == [2, 2]


def test_bad_input_is_one_line(capsys):
    assert glmstack_main(["ablate", "no_such_claim"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown claim 'no_such_claim'" in err[0] and "muon" in err[0]
    assert main(["--list"]) == 0
    assert "icepop" in capsys.readouterr().out


def test_corpora_train_and_validation_documents_come_from_the_same_task():
    from glmstack.ablate import corpora

    def transitions(docs):
        return [(int(d[0]), int(a), int(b)) for d in docs for a, b in itertools.pairwise(d[1:])]

    seen = set(transitions(corpora.topic_documents(2000, 64, seed=1)))
    val = transitions(corpora.topic_documents(100, 64, seed=2))
    assert sum(t in seen for t in val) / len(val) > 0.9  # the same chains (other chains: ~1/40)
    doc, answers = corpora.lookup_document(__import__("numpy").random.default_rng(0))
    table = {int(doc[i]): int(doc[i + 1]) for i in range(0, 2 * corpora.N_KEYS, 2)}
    for p in answers[::2]:  # q f(q) f(f(q)) after each query marker
        assert doc[p - 2] == corpora.QUERY and table[int(doc[p - 1])] == doc[p] and table[int(doc[p])] == doc[p + 1]
