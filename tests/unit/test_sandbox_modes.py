"""Each isolation mode runs programs, reports its layers, cleans up, and refuses to run untrusted code as root."""

import os
import subprocess
import tempfile
import time

import pytest

from glmstack.sandbox import isolation, run, uids

SYSTEM_PYTHON = "/usr/bin/python3"  # world-readable, so a root caller can drop to the sandbox uid outside bwrap


def _need(mode):
    if not isolation.available(mode):
        pytest.skip(f"{mode} mode unavailable here")


@pytest.fixture
def reachable_python(monkeypatch):
    if os.geteuid() == 0:
        if not os.access(SYSTEM_PYTHON, os.X_OK):
            pytest.skip("needs /usr/bin/python3 to test the weaker modes as root")
        monkeypatch.setenv("GLMSTACK_SANDBOX_PYTHON", SYSTEM_PYTHON)


def test_plain_mode_runs_and_removes_its_host_work_dir(reachable_python):
    _need("plain")
    r = run("open('out.txt', 'w').write('x'); import os; print(os.listdir('.'))", mode="plain", timeout_s=5)
    assert r.ok and r.stdout == "['out.txt']\n" and r.mode == "plain"
    assert r.work_dir is not None and not os.path.exists(r.work_dir)
    assert set(isolation.LAYERS["plain"]) <= set(r.layers)
    if os.geteuid() == 0:
        assert "uid" in r.layers and uids.uid_pids(r.uid) == []


@pytest.mark.parametrize("mode", ["bwrap", "unshare"])
def test_work_dir_is_a_fresh_tmpfs(mode):
    _need(mode)
    first = run("open('left.txt', 'w').write('x'); import os; print(os.getcwd())", mode=mode, timeout_s=5)
    second = run("import os; print(os.listdir('.'), os.listdir('/tmp'))", mode=mode, timeout_s=5)
    assert first.stdout == f"{isolation.SANDBOX_DIR}\n" and second.stdout == "[] []\n"
    assert first.work_dir is None and set(isolation.LAYERS[mode]) <= set(first.layers)


@pytest.mark.skipif(os.geteuid() != 0, reason="the refusal concerns root callers")
def test_root_without_reachable_interpreter_is_refused(monkeypatch, tmp_path):
    _need("plain")
    hidden = tmp_path / "hidden"
    hidden.mkdir(mode=0o700)
    os.symlink(SYSTEM_PYTHON, hidden / "python3")
    monkeypatch.setenv("GLMSTACK_SANDBOX_PYTHON", str(hidden / "python3"))
    monkeypatch.setattr(isolation, "python_exe", lambda: str(hidden / "python3"))  # realpath would unhide it
    monkeypatch.delenv("GLMSTACK_SANDBOX_UNSAFE_ROOT", raising=False)
    with pytest.raises(RuntimeError, match="refusing to run untrusted code as root"):
        run("print(1)", mode="plain")


@pytest.mark.skipif(os.geteuid() != 0, reason="the fallback concerns root callers")
def test_root_falls_back_to_a_system_python_the_uid_can_run(monkeypatch, tmp_path):
    _need("plain")
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip("no /usr/bin/python3")
    hidden = tmp_path / "hidden"
    hidden.mkdir(mode=0o700)
    monkeypatch.setattr(isolation, "python_exe", lambda: str(hidden / "python3"))
    monkeypatch.delenv("GLMSTACK_SANDBOX_PYTHON", raising=False)
    isolation._warn_once.cache_clear()  # it warns once per process
    with pytest.warns(RuntimeWarning, match="not reachable by the sandbox uid"):
        r = run("import sys; print(sys.executable)", mode="plain", timeout_s=5)
    assert r.ok and r.stdout.strip() == os.path.realpath(SYSTEM_PYTHON) and "uid" in r.layers


def test_auto_resolves_to_an_available_mode():
    assert isolation.resolve("auto") in isolation.MODES
    assert isolation.available(isolation.resolve("auto"))


CAPS = "s = open('/proc/self/status').read(); print([ln for ln in s.splitlines() if ln[:6] in ('CapEff', 'CapPrm', 'NoNewP')])"


@pytest.mark.parametrize("mode", ["bwrap", "unshare", "plain"])
def test_no_capabilities_and_no_new_privileges(mode, reachable_python):
    _need(mode)
    r = run(CAPS, mode=mode, timeout_s=5)
    assert r.ok, r.stderr
    assert "'CapPrm:\\t0000000000000000'" in r.stdout and "'CapEff:\\t0000000000000000'" in r.stdout
    if mode == "bwrap" or "no-new-privs" in r.layers:
        assert "'NoNewPrivs:\\t1'" in r.stdout


LINGER = """import os, sys, time
for _ in range(3):
    if os.fork() == 0:
        break
open(f"f{os.getpid()}", "w").write("x")
os.close(1)
os.close(2)
time.sleep(60)"""


@pytest.mark.parametrize("mode", ["bwrap", "unshare", "plain"])
def test_timed_out_run_leaves_no_process_and_no_work_dir(mode, reachable_python):
    _need(mode)
    before = set(os.listdir(tempfile.gettempdir()))
    r = run(LINGER, mode=mode, timeout_s=1)  # closes its output and lingers: still timed out, still killed
    assert r.timed_out and 1 <= r.duration_s < 4
    if r.uid is not None:
        assert uids.uid_pids(r.uid) == []
    assert not [p for p in os.listdir("/proc") if p.isdigit() and _parent(p) == os.getpid()]
    assert r.work_dir is None or not os.path.exists(r.work_dir)
    assert _new_sandbox_dirs(before, f"glmstack-sandbox-{r.uid if r.uid is not None else 'u'}-") == set()


def _new_sandbox_dirs(before: set, prefix: str, settle_s: float = 5.0) -> set:
    """Work dirs with this prefix created since `before` that stay: under pytest-xdist another worker's sandbox
    runs come and go in the same /tmp, so a dir counts as leaked only if it is still there after `settle_s`."""
    deadline = time.monotonic() + settle_s
    while True:
        new = {d for d in set(os.listdir(tempfile.gettempdir())) - before if d.startswith(prefix)}
        if not new or time.monotonic() > deadline:
            return new
        time.sleep(0.2)


def _parent(pid: str) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


@pytest.mark.skipif(os.geteuid() != 0, reason="concerns a root caller's bwrap")
def test_boot_starts_with_only_the_capabilities_it_needs():
    _need("bwrap")
    argv = isolation.bwrap_argv(1) + [isolation.python_exe(), "-I", "-S", "-c", CAPS]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=30).stdout
    assert "'CapEff:\\t00000000002000c1'" in out  # CHOWN | SETGID | SETUID | SYS_ADMIN, before the uid switch
