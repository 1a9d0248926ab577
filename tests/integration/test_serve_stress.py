"""The prefix cache under load, over loopback with the official openai client (tests/serve_stress.py): concurrent
streaming clients with shared and diverging prefixes, cancellations mid-stream and a cache budget that forces
evictions give exactly the single-request, no-cache greedy outputs; with one cached block corrupted
(--fault-block) the same harness reports mismatches. The issue's scale (2,000 requests, 64 concurrent) is
bench/agent_serve.py stress."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("openai")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from serve_stress import build_random_checkpoint, stress

pytestmark = pytest.mark.slow  # ~10 s on a quiet 2-core machine (a minute under load)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return build_random_checkpoint(tmp_path_factory.mktemp("stress") / "tiny")


def test_stress_outputs_equal_no_cache_references(ckpt):
    res = stress(ckpt, n=48, concurrency=12, budget_mb=0.25, time_limit=300)
    assert res["errors"] == 0 and res["mismatches"] == 0, res
    assert res["cancelled"] > 0 and res["completed"] > 0, res
    assert res["evicted"] > 0 and res["prefill_computed"] < res["prompt_tokens"], res  # evictions, and hits


def test_stress_catches_a_corrupted_block(ckpt):
    res = stress(ckpt, n=24, concurrency=8, budget_mb=0.25, fault_block=0, time_limit=300)
    assert res["errors"] == 0 and res["mismatches"] > 0, res


def test_speculative_metadata_and_metrics(tmp_path):
    """--speculative mtp over the prefix cache: the response carries acceptance length / rate and the monitor's
    verdict, /metrics the totals and the anomaly counts, usage the cached prompt tokens; output == no-cache generate."""
    import urllib.request

    import openai
    from serve_fixture import RunningServer

    ckpt = build_random_checkpoint(tmp_path / "mtp", num_nextn_predict_layers=1)
    srv = RunningServer(ckpt, speculative="mtp", draft=2, prefix_cache_mb=1, monitor="flag", monitor_min_tokens=8)
    try:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        prompt, outs = list(range(3, 60)), []
        for p in (prompt, prompt + [7, 8]):
            r = client.completions.create(model="tiny", prompt=p, max_tokens=16, temperature=0,
                                          extra_body={"return_token_ids": True, "ignore_eos": True})  # fmt: skip
            outs.append(r.choices[0].model_extra["token_ids"])
        spec = r.choices[0].model_extra["speculative"]
        metrics = urllib.request.urlopen(srv.url + "/metrics").read().decode()
    finally:
        srv.stop()
    assert r.usage.prompt_tokens_details.cached_tokens == 48  # the second request reused 3 blocks of 16
    assert spec["verify_steps"] > 0 and spec["acceptance_length"] >= 1.0 and spec["anomaly"] == "corrupted-context"
    assert 'glmstack:speculative_anomalies_total{rule="corrupted-context"} 2' in metrics
    assert "glmstack:speculative_acceptance_length" in metrics and "glmstack:prefix_cache_hit_rate" in metrics
    assert outs == [srv.engine.generate([p], 16, stop_ids=[]).tokens[0] for p in (prompt, prompt + [7, 8])]
