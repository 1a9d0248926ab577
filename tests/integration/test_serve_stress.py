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
