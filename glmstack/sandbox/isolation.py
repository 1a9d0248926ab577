"""How a sandboxed process is launched: the isolation mode, its command line, the sandbox uid, and cleanup.

Three modes, strongest first; `auto` picks the first that works on this host (probed once per process):

- `bwrap`   bubblewrap: new PID, network, IPC, UTS and mount namespaces; a fresh root that holds only the
            interpreter and the system libraries, read-only; a size-limited tmpfs work dir at /sandbox;
            --die-with-parent. Killing bwrap kills the namespace's init, and the kernel then kills every
            process in the namespace, so setsid + double fork cannot outlive a run.
- `unshare` util-linux unshare (root only): new PID, network, IPC, UTS namespaces with --kill-child; the
            file system is the host's (read by the sandbox uid's permissions), the work dir is a host temp dir.
- `plain`   a fresh process in its own session; nothing else from the kernel.

In every mode: rlimits (limits.py), a scrubbed environment, an empty work dir removed afterwards, a wall-clock
kill of the process group, and, when we are root, a dedicated unprivileged uid per execution (held with a lock
file so concurrent runners never share one). RLIMIT_NPROC counts per uid and is ignored for root, so the uid
is what makes the process limit bite; after each run every process of that uid is killed (the backstop for
`plain`, where a daemon could escape the process group). docs/sandbox.md has the full table.
"""

from __future__ import annotations

import fcntl
import functools
import itertools
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

BOOT = (Path(__file__).with_name("boot.py")).read_text()
UID_BASE, UID_SLOTS = 2_000_000_000, 4096  # far above any real account; uid_t is 32-bit
LOCK_DIR = Path(tempfile.gettempdir()) / "glmstack-sandbox-uids"
SANDBOX_DIR = "/sandbox"
MODES = ("bwrap", "unshare", "plain")
PAGE = os.sysconf("SC_PAGE_SIZE")
LAYERS = {
    "bwrap": ("process", "rlimits", "session", "clean-env", "workdir", "pid-ns", "net-ns", "ipc-ns", "ro-root",
              "hidden-host-files", "tmpfs-workdir", "die-with-parent"),
    "unshare": ("process", "rlimits", "session", "clean-env", "workdir", "pid-ns", "net-ns", "ipc-ns"),
    "plain": ("process", "rlimits", "session", "clean-env", "workdir"),
}


def python_exe() -> str:
    """The interpreter the sandbox runs (isolated, -I): env GLMSTACK_SANDBOX_PYTHON, else our base interpreter
    (not a venv shim). Outside bwrap a root caller needs one the sandbox uid can reach, e.g. /usr/bin/python3."""
    exe = os.environ.get("GLMSTACK_SANDBOX_PYTHON") or getattr(sys, "_base_executable", None) or sys.executable
    return os.path.realpath(exe)


def env_for(home: str) -> dict[str, str]:
    """The whole environment the program sees: nothing of the parent's (no tokens, no proxies, no paths)."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8",
            "PYTHONIOENCODING": "utf-8", "PYTHONDONTWRITEBYTECODE": "1"}


# ---------------------------------------------------------------- uid slots
class UidSlot:
    """An exclusive unprivileged uid for one execution, held by an flock so other runners skip it."""

    def __init__(self):
        LOCK_DIR.mkdir(mode=0o700, exist_ok=True)
        for slot in random.sample(range(UID_SLOTS), 64):
            fd = os.open(LOCK_DIR / f"{slot}.lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self.uid, self._fd = UID_BASE + slot, fd
            return
        raise RuntimeError("sandbox: no free uid slot (more than 4096 concurrent executions?)")

    def release(self) -> None:
        kill_uid(self.uid)
        os.close(self._fd)


def uid_pids(uid: int) -> list[int]:
    """Live (not zombie) processes owned by `uid`: zombies hold nothing and cannot be killed.

    /proc/<pid> belongs to the process's effective uid; a stat per process keeps this scan well under 1 ms.
    """
    pids = []
    for name in os.listdir("/proc"):
        try:
            if not name.isdigit() or os.stat(f"/proc/{name}").st_uid != uid:
                continue
            with open(f"/proc/{name}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            pids.append(int(name))
    return pids


def resident_bytes(uid: int) -> int:
    """Total resident memory of the processes owned by `uid` (the sandbox's memory watchdog)."""
    total = 0
    for pid in uid_pids(uid):
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * PAGE
        except (OSError, IndexError):
            pass
    return total


def kill_uid(uid: int, wait_s: float = 5.0) -> None:
    """SIGKILL every process whose uid is `uid`, again while a forking one races us, and wait until they are gone
    (a killed process with a lot of memory takes a while to exit)."""
    deadline = time.monotonic() + wait_s
    for rnd in itertools.count():
        pids = uid_pids(uid)
        if not pids:
            return
        if time.monotonic() > deadline:
            warnings.warn(f"sandbox: processes {pids} of uid {uid} survive SIGKILL", RuntimeWarning, stacklevel=2)
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(min(0.001 * rnd, 0.02))


# ---------------------------------------------------------------- command lines
def _ro_binds(extra: tuple[str, ...]) -> list[str]:
    """bwrap arguments for the read-only system dirs and the interpreter; every ancestor made 0755."""
    args = []
    for top in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    args += ["--perms", "0755", "--dir", "/etc"]
    for f in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/localtime", "/etc/alternatives"):
        args += ["--ro-bind-try", f, f]
    exe = python_exe()
    prefix = os.path.realpath(sys.base_prefix) if exe == os.path.realpath(sys._base_executable) else None
    made = set()
    for path in dict.fromkeys(p for p in (prefix, os.path.dirname(os.path.dirname(exe)), *extra) if p):
        if path.startswith("/usr/"):
            continue
        for parent in reversed(Path(path).parents[:-1]):  # "/a/b/c" -> /a, /a/b (not /)
            if str(parent) not in made:
                made.add(str(parent))
                args += ["--perms", "0755", "--dir", str(parent)]
        args += ["--ro-bind", path, path]
    return args


def bwrap_argv(work_dir_mb: int, extra_ro: tuple[str, ...] = ()) -> list[str]:
    """The bwrap prefix of the command line; the program then runs as `python -I -S -c BOOT`."""
    args = ["bwrap", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", "--hostname", "sandbox"]
    if os.geteuid() == 0:  # boot.py switches to the sandbox uid; these are dropped with that switch
        args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_CHOWN"]
    args += _ro_binds(extra_ro)
    args += ["--proc", "/proc", "--dev", "/dev", "--size", str(work_dir_mb << 20), "--tmpfs", SANDBOX_DIR,
             "--symlink", SANDBOX_DIR, "/tmp", "--remount-ro", "/", "--chdir", SANDBOX_DIR]
    return args


def deathsig_argv() -> list[str]:
    """Outside bwrap, SIGKILL the launched process when its parent (us) dies, via util-linux setpriv."""
    return ["setpriv", "--pdeathsig", "KILL"] if shutil.which("setpriv") else []


def unshare_argv() -> list[str]:
    # --kill-child: when unshare dies (e.g. of the death signal above), the namespace's init and all in it die
    return [*deathsig_argv(), "unshare", "--pid", "--net", "--ipc", "--uts", "--fork", "--kill-child"]


def python_argv(site: bool = False) -> list[str]:
    return [python_exe(), "-I", *([] if site else ["-S"]), "-c", BOOT]


# ---------------------------------------------------------------- mode detection
def _probe(prefix: list[str]) -> bool:
    try:
        cmd = [*prefix, python_exe(), "-I", "-S", "-c", "import os; os.getcwd()"]
        return subprocess.run(cmd, capture_output=True, timeout=10, cwd="/").returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@functools.cache
def available(mode: str) -> bool:
    """Whether `mode` works here (a real trial run, cached for the process)."""
    if mode == "bwrap":
        return shutil.which("bwrap") is not None and _probe(bwrap_argv(1))
    if mode == "unshare":
        return os.geteuid() == 0 and shutil.which("unshare") is not None and _probe(unshare_argv())
    return mode == "plain"


@functools.cache
def resolve(mode: str = "auto") -> str:
    """`auto` -> the strongest available mode (env GLMSTACK_SANDBOX forces one); warns once when weaker."""
    mode = os.environ.get("GLMSTACK_SANDBOX", mode) if mode == "auto" else mode
    if mode not in ("auto", *MODES):
        raise ValueError(f"sandbox mode must be auto or one of {MODES}, got {mode!r}")
    if mode != "auto":
        if not available(mode):
            raise RuntimeError(f"sandbox mode {mode!r} is not available on this host (see docs/sandbox.md)")
        return mode
    chosen = next(m for m in MODES if available(m))
    if chosen != "bwrap":
        warnings.warn(f"sandbox: bubblewrap unavailable, running in the weaker {chosen!r} mode (no read-only "
                      f"root{'' if chosen == 'unshare' else ', no network or PID namespace'}); see docs/sandbox.md",
                      RuntimeWarning, stacklevel=3)
    return chosen


def uid_usable(mode: str) -> bool:
    """A dedicated uid needs root, and outside bwrap the interpreter must be reachable for that uid."""
    if os.geteuid() != 0:
        return False
    if mode == "bwrap":
        return True
    exe = Path(python_exe())
    return bool(os.stat(exe).st_mode & 0o001) and all(os.stat(p).st_mode & 0o001 for p in exe.parents)


def _is_free(uid: int) -> bool:
    """Whether no live runner holds `uid`'s lock (so its work dirs are stale)."""
    try:
        fd = os.open(LOCK_DIR / f"{uid - UID_BASE}.lock", os.O_RDWR)
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def clear_stale_work_dirs(own_uid: int) -> None:
    """Remove host work dirs, and kill processes, left by runners killed before their cleanup (outside bwrap a
    program's children can outlive a SIGKILLed runner). Dirs are named by uid, and a uid whose lock is free
    (or our own, whose lock we hold) has no live runner."""
    for d in Path(tempfile.gettempdir()).glob("glmstack-sandbox-[0-9]*-*"):
        uid = int(d.name.split("-")[2])
        if uid == own_uid or _is_free(uid):
            kill_uid(uid)
            shutil.rmtree(d, ignore_errors=True)


@dataclass
class Launch:
    """Everything run.py needs to start one execution and clean up after it."""

    argv: list[str]
    cwd: str
    env: dict[str, str]
    layers: tuple[str, ...]
    uid: int | None = None  # the sandbox uid boot.py switches to (None: we are not root, keep ours)
    host_dir: str | None = None  # host temp work dir to remove afterwards (unshare/plain)
    slot: UidSlot | None = field(default=None, repr=False)

    def cleanup(self) -> None:
        if self.slot is not None:
            self.slot.release()
        if self.host_dir is not None:
            shutil.rmtree(self.host_dir, ignore_errors=True)


def prepare(mode: str, work_dir_mb: int, site: bool = False, extra_ro: tuple[str, ...] = ()) -> Launch:
    """Allocate the uid and work dir and build the command line for one execution in `mode`."""
    slot = UidSlot() if uid_usable(mode) else None
    if slot is None and os.geteuid() == 0 and mode != "bwrap" and not os.environ.get("GLMSTACK_SANDBOX_UNSAFE_ROOT"):
        raise RuntimeError(
            f"sandbox: refusing to run untrusted code as root in {mode!r} mode: {python_exe()} is not reachable by "
            "an unprivileged uid. Install bubblewrap, or set GLMSTACK_SANDBOX_PYTHON to a world-readable "
            "interpreter such as /usr/bin/python3 (or GLMSTACK_SANDBOX_UNSAFE_ROOT=1 to run as root anyway).")
    layers = LAYERS[mode] + (("uid",) if slot else ())
    if mode != "bwrap" and deathsig_argv():  # plain: only the main process gets the death signal
        layers += ("die-with-parent",) if mode == "unshare" else ("main-dies-with-parent",)
    uid = slot.uid if slot else None
    if mode == "bwrap":
        return Launch(bwrap_argv(work_dir_mb, extra_ro) + python_argv(site), "/", env_for(SANDBOX_DIR),
                      layers, uid, None, slot)
    if uid is not None:
        clear_stale_work_dirs(uid)
    host_dir = tempfile.mkdtemp(prefix=f"glmstack-sandbox-{uid if uid is not None else 'u'}-")
    prefix = unshare_argv() if mode == "unshare" else deathsig_argv()
    return Launch(prefix + python_argv(site), host_dir, env_for(host_dir), layers, uid, host_dir, slot)
