"""The speedrun's per-stage thread count (glmstack/speedrun/threads.py): the idle cores, measured from /proc/stat."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from glmstack.speedrun.threads import MAX_THREADS, busy_cores, pick_threads


def test_pick_threads_takes_the_idle_cores():
    assert [pick_threads(2, b) for b in (0.0, 0.4, 1.0, 1.9, 2.0)] == [2, 2, 1, 1, 1]
    assert pick_threads(16, 0.0) == MAX_THREADS and pick_threads(16, 14.0) == 2
    assert pick_threads(8, None) == 4 and pick_threads(2, None) == 1  # no /proc/stat: half the cores


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="Linux only")
def test_busy_cores_sees_another_process_spinning():
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        during = busy_cores(0.5)
    finally:
        spinner.kill()
        spinner.wait()
    assert during >= 0.8, during  # whatever else runs, the spinner's core is counted busy


def test_a_run_keeps_the_thread_count_it_started_with(tmp_path, monkeypatch):
    """The count is chosen once, kept in speedrun.json and reused when the run continues whatever the load then,
    since the figures depend on it; OMP_NUM_THREADS overrides it and is recorded."""
    import json

    from glmstack.recipes.speedrun import size_for
    from glmstack.speedrun.run import Run, check_same_run

    run = Run(out=tmp_path / "run", seed=0, minutes=0, size=size_for(0))
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert check_same_run(run) == 3
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert check_same_run(run) == 3  # continued: the recorded count, not the idle cores now
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert check_same_run(run) == 1 and json.loads((run.out / "speedrun.json").read_text())["threads"] == 1
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert check_same_run(run) == 1
