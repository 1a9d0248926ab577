"""`glmstack speedrun` end to end at the one-minute budget: report written, losses fall, MTP accepts drafts,
an interrupted run continues without redoing finished stages, and one seed gives the same figures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from glmstack.recipes import speedrun

STAGE_NAMES = ["tokenizer", "data", "pretrain", "midtrain", "evaluate", "report"]


def _speedrun(out: Path, stop_after: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop(speedrun.STOP_ENV, None)
    if stop_after:
        env[speedrun.STOP_ENV] = stop_after
    cmd = [sys.executable, "-m", "glmstack.cli", "speedrun", "--out", str(out), "--minutes", "1", "--seed", "0"]
    return subprocess.run(cmd, check=False, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Run A stopped after pre-training then continued; run B straight through. Both with seed 0."""
    base = tmp_path_factory.mktemp("speedrun")
    a, b = base / "a", base / "b"
    first = _speedrun(a, stop_after="pretrain")
    assert first.returncode == speedrun.STOPPED_EXIT, first.stdout[-3000:] + first.stderr[-3000:]
    marks = {s: (a / s / "DONE.json").stat().st_mtime_ns for s in ("tokenizer", "data", "pretrain")}
    second = _speedrun(a)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    straight = _speedrun(b)
    assert straight.returncode == 0, straight.stdout[-3000:] + straight.stderr[-3000:]
    return {"a": a, "b": b, "marks": marks, "second": second}


def _figures(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())["figures"]


@pytest.mark.slow
def test_report_and_figures(runs):
    out = runs["b"]
    report = (out / "report.md").read_text()
    assert "| figure | value |" in report
    for png in ("losses.png", "lr.png", "expert_load.png", "perplexity_by_position.png", "accepted_length.png"):
        assert (out / "plots" / png).stat().st_size > 1000, png
    fig = _figures(out)
    assert fig["pretrain val loss, last"] < fig["pretrain val loss, first"]
    assert fig["midtrain val loss, last"] < fig["midtrain val loss, first"]
    assert fig["MTP mean accepted length"] >= 1.0


@pytest.mark.slow
def test_rerun_continues_and_skips_finished_stages(runs):
    a, second = runs["a"], runs["second"]
    for stage, mtime in runs["marks"].items():
        assert (a / stage / "DONE.json").stat().st_mtime_ns == mtime, f"{stage} was redone"
        assert f"{stage}: done already" in second.stdout
    assert all((a / s / "DONE.json").exists() for s in STAGE_NAMES)


@pytest.mark.slow
def test_one_seed_same_figures(runs):
    """Interrupted-and-continued equals straight through, figure for figure (wall-clock times are kept apart)."""
    assert _figures(runs["a"]) == _figures(runs["b"])


def test_stage_runner_skips_done_and_stops(tmp_path, monkeypatch):
    calls = []

    def stage(name):
        return name, name, lambda run: calls.append(name) or {"name": name}

    run = speedrun.Run(out=tmp_path, seed=0, minutes=1, size=speedrun.size_for(1))
    stages = [stage("x"), stage("y"), stage("z")]
    monkeypatch.setenv(speedrun.STOP_ENV, "y")
    with pytest.raises(speedrun.StopRequested):
        speedrun.run_stages(run, stages)
    assert calls == ["x", "y"]
    monkeypatch.delenv(speedrun.STOP_ENV)
    results = speedrun.run_stages(run, stages)
    assert calls == ["x", "y", "z"] and results["x"]["name"] == "x"


def test_size_table_is_monotone():
    assert speedrun.size_for(0.5) == speedrun.SIZES[0] and speedrun.size_for(15).minutes == 15
    steps = [s.pretrain_steps for s in speedrun.SIZES]
    assert steps == sorted(steps)
