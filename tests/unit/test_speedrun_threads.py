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
