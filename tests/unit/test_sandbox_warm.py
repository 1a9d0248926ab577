"""Warm sandboxes: same results as a cold run, nothing carried between executions, recovery from a dead zygote."""

import os
import signal
import threading

import pytest

from glmstack.sandbox import Job, Limits, WarmSandbox, run, run_batch, uids
from glmstack.sandbox.warm import warm_available

pytestmark = pytest.mark.skipif(not warm_available(), reason="warm sandboxes need root and bubblewrap")


@pytest.fixture
def box():
    with WarmSandbox() as b:
        yield b


def test_same_results_as_a_cold_run(box):
    code = "import sys; print(input(), open('d/f.txt').read(), sys.argv[1:]); sys.exit(4)"
    kw = {"stdin": "in", "files": {"d/f.txt": "file"}, "argv": ("a",), "limits": Limits(timeout_s=5)}
    warm, cold = box.run(code, **kw), run(code, **kw)
    assert (warm.stdout, warm.stderr, warm.exit_code) == (cold.stdout, cold.stderr, cold.exit_code)
    assert warm.exit_code == 4 and "warm-fork" in warm.layers and "uid" in warm.layers


def test_each_execution_has_its_own_uid_and_empty_dirs(box):
    leave = "import os\nfor d in ('.', '/tmp', '/dev/shm'):\n    open(os.path.join(d, 'left'), 'w').write('x')\nprint(os.getuid())"
    look = "import os\nprint(os.getuid(), os.listdir('.'), os.listdir('/tmp'), os.listdir('/dev/shm'))"
    first, second = box.run(leave, timeout_s=5), box.run(look, timeout_s=5)
    assert first.ok and second.ok, first.stderr + second.stderr
    assert second.stdout == f"{second.uid} [] [] []\n" and first.uid != second.uid


def test_threads_and_atexit_finish_before_the_exit(box):
    code = (
        "import atexit, threading, time\n"
        "atexit.register(lambda: print('atexit'))\n"
        "threading.Thread(target=lambda: (time.sleep(0.2), print('thread'))).start()\n"
        "raise SystemExit(2)"
    )
    r = box.run(code, timeout_s=5)
    assert r.stdout == "thread\natexit\n" and r.exit_code == 2


def test_a_killed_zygote_is_replaced(box):
    assert box.run("print(1)").stdout == "1\n"
    os.killpg(box._proc.pid, signal.SIGKILL)
    box._proc.wait()
    assert box.run("print(2)").stdout == "2\n"


def test_timeout_kills_everything_of_the_uid(box):
    r = box.run("import os, time\nos.fork()\nos.fork()\ntime.sleep(60)", timeout_s=0.5)
    assert r.timed_out and uids.uid_pids(r.uid) == []
    assert box.run("print('next')").stdout == "next\n"


def test_run_batch_uses_warm_boxes():
    results = run_batch([Job(code=f"print({i})") for i in range(6)], concurrency=2, warm=True)
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(6)]
    assert all("warm-fork" in r.layers for r in results)
    assert all("warm-fork" not in r.layers for r in run_batch(["print(1)"], warm=False))


def test_a_zygote_killed_mid_execution_is_replaced_and_the_run_retried(box):
    killer = threading.Timer(0.5, lambda: os.killpg(box._proc.pid, signal.SIGKILL))
    killer.start()
    r = box.run("import time; time.sleep(1.5); print('done')", timeout_s=10)
    killer.join()
    assert r.ok and r.stdout == "done\n" and uids.uid_pids(r.uid) == []
