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


def test_the_speedrun_trains_on_the_recorded_count_and_refuses_a_bad_omp_value(tmp_path, monkeypatch):
    """Through `glmstack speedrun` (stopped after its first stage): torch runs on the count speedrun.json records;
    a malformed OMP_NUM_THREADS is one line, not a traceback."""
    import json

    import torch

    from glmstack.speedrun import STOP_ENV, STOPPED_EXIT
    from glmstack.speedrun import main as speedrun

    before = torch.get_num_threads()
    monkeypatch.setenv(STOP_ENV, "tokenizer")
    monkeypatch.setenv("OMP_NUM_THREADS", "x2")
    with pytest.raises(SystemExit, match="OMP_NUM_THREADS='x2' is not a positive whole number"):
        speedrun(["--out", str(tmp_path / "bad"), "--minutes", "0"])
    assert not (tmp_path / "bad").exists()  # nothing written
    monkeypatch.delenv("OMP_NUM_THREADS")
    out = tmp_path / "run"  # a run started earlier with another count than this process has
    out.mkdir()
    from dataclasses import asdict

    from glmstack.recipes.speedrun import size_for

    want = {"minutes": 0.0, "seed": 0, "size": asdict(size_for(0)), "threads": 3 if before != 3 else 2}
    (out / "speedrun.json").write_text(json.dumps(want))
    try:
        assert speedrun(["--out", str(out), "--minutes", "0"]) == STOPPED_EXIT
        assert torch.get_num_threads() == want["threads"]
    finally:
        torch.set_num_threads(before)
