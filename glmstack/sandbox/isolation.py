"""How a sandboxed process is launched: the isolation mode, its command line, the sandbox uid, and cleanup.

Three modes, strongest first; `auto` picks the first that works on this host (probed once per process):

- `bwrap`   bubblewrap: new PID, network, IPC, UTS and mount namespaces; a fresh root that holds only the
            interpreter and the system libraries, read-only; a size-limited tmpfs work dir at /sandbox;
            a seccomp filter (seccomp.py); --die-with-parent. Killing bwrap kills the namespace's init, and the kernel then kills every
            process in the namespace, so setsid + double fork cannot outlive a run.
- `unshare` util-linux unshare (root only): new PID, network, IPC, UTS namespaces with --kill-child; the
            file system is the host's (read by the sandbox uid's permissions), the work dir is a host temp dir.
- `plain`   a fresh process in its own session; nothing else from the kernel.

In every mode: rlimits (limits.py), a scrubbed environment, an empty work dir removed afterwards, a wall-clock
kill of the process group, and, when we are root, a dedicated unprivileged uid per execution (held with a lock
file so concurrent runners never share one). RLIMIT_NPROC counts per uid and is ignored for root, so the uid
is what makes the process limit bite; after each run every process of that uid is killed (the backstop for
`plain`, where a daemon could escape the process group; uids.py). warm.py reuses one bwrap for many
executions. docs/sandbox.md has the full table.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from glmstack.sandbox import seccomp
from glmstack.sandbox.uids import UidSlot, clear_stale_work_dirs

BOOT = (Path(__file__).with_name("boot.py")).read_text()
SANDBOX_DIR = "/sandbox"
NAMESPACES = "--unshare-pid --unshare-net --unshare-ipc --unshare-uts --unshare-cgroup-try --die-with-parent --new-session --hostname sandbox"
SYSTEM_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3")  # fallbacks a sandbox uid can usually run
MODES = ("bwrap", "unshare", "plain")
LAYERS = {
    "bwrap": (
        "process",
        "rlimits",
        "session",
        "clean-env",
        "workdir",
        "pid-ns",
        "net-ns",
        "ipc-ns",
        "ro-root",
        "hidden-host-files",
        "tmpfs-workdir",
        "die-with-parent",
        "no-new-privs",
    ),
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
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": home,
        "TMPDIR": home,
        "LANG": "C.UTF-8",
        "PYTHONIOENCODING": "utf-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        # one thread per numerical library: threads count against max_processes, and cores are shared
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


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
    wanted = [prefix, os.path.dirname(os.path.dirname(exe)), *(os.path.realpath(e) for e in extra)]
    for path in dict.fromkeys(p for p in wanted if p):
        if path == "/usr" or path.startswith("/usr/"):  # already bound
            continue
        for parent in reversed(Path(path).parents[:-1]):  # "/a/b/c" -> /a, /a/b (not /)
            if str(parent) not in made:
                made.add(str(parent))
                args += ["--perms", "0755", "--dir", str(parent)]
        args += ["--ro-bind", path, path]
    return args


def bwrap_argv(
    work_dir_mb: int, extra_ro: tuple[str, ...] = (), warm: bool = False, seccomp_fd: int | None = None
) -> list[str]:
    """The bwrap prefix of the command line; the program then runs as `python -I -S -c BOOT`. `warm`: for a
    zygote (warm.py), where /sandbox holds one work dir per execution and /tmp is a tmpfs it clears after each."""
    size = str(work_dir_mb << 20)
    args = ["bwrap", *NAMESPACES.split()]
    if os.geteuid() == 0:  # a root bwrap keeps all of root's capabilities unless told; boot.py needs only these
        args += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_CHOWN"]
    if seccomp_fd is not None:
        args += ["--seccomp", str(seccomp_fd)]
    args += _ro_binds(extra_ro)
    args += ["--proc", "/proc", "--dev", "/dev", "--size", size, "--perms", "1777", "--tmpfs", "/dev/shm"]
    args += ["--size", size, "--tmpfs", SANDBOX_DIR]
    args += ["--size", size, "--perms", "1777", "--tmpfs", "/tmp"] if warm else ["--symlink", SANDBOX_DIR, "/tmp"]
    return args + ["--remount-ro", "/", "--chdir", SANDBOX_DIR]


def deathsig_argv() -> list[str]:
    """Outside bwrap, via util-linux setpriv: SIGKILL the launched process when its parent (us) dies, and set
    no_new_privs so no setuid binary on the host (su, sudo, ...) can give the program privileges back
    (bwrap sets no_new_privs itself)."""
    return ["setpriv", "--pdeathsig", "KILL", "--no-new-privs"] if shutil.which("setpriv") else []


def unshare_argv() -> list[str]:
    # --kill-child: when unshare dies (e.g. of the death signal above), the namespace's init and all in it die
    return [*deathsig_argv(), "unshare", "--pid", "--net", "--ipc", "--uts", "--fork", "--kill-child"]


def python_argv(exe: str, site: bool = False) -> list[str]:
    return [exe, "-I", *([] if site else ["-S"]), "-c", BOOT]


# ---------------------------------------------------------------- mode detection
def _probe(prefix: list[str]) -> bool:
    try:
        cmd = [*prefix, python_exe(), "-I", "-S", "-c", "import os; os.getcwd()"]
        return subprocess.run(cmd, capture_output=True, timeout=10, cwd="/", check=False).returncode == 0
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
        warnings.warn(
            f"sandbox: bubblewrap unavailable, running in the weaker {chosen!r} mode (no read-only "
            f"root{'' if chosen == 'unshare' else ', no network or PID namespace'}); see docs/sandbox.md",
            RuntimeWarning,
            stacklevel=3,
        )
    return chosen


@functools.cache
def _warn_once(message: str) -> None:
    warnings.warn(message, RuntimeWarning, stacklevel=4)


def _reachable(exe: str) -> bool:
    """Whether any uid may execute `exe` (world-x on it and on every directory above it)."""
    p = Path(exe)
    return os.path.exists(p) and all(os.stat(q).st_mode & 0o001 for q in (p, *p.parents))


def interpreter(mode: str) -> str:
    """The interpreter for this run: python_exe(), except that outside bwrap a root caller needs one the sandbox
    uid can execute, so an unreachable default (e.g. pyenv under /root, mode 0700) falls back to a system
    python3, with a warning. An explicit GLMSTACK_SANDBOX_PYTHON is never replaced."""
    exe = python_exe()
    if mode == "bwrap" or os.geteuid() != 0 or _reachable(exe) or os.environ.get("GLMSTACK_SANDBOX_PYTHON"):
        return exe
    for candidate in SYSTEM_PYTHONS:
        if _reachable(os.path.realpath(candidate)):
            _warn_once(f"sandbox: {exe} is not reachable by the sandbox uid; running {candidate} instead")
            return os.path.realpath(candidate)
    return exe


def uid_usable(mode: str) -> bool:
    """A dedicated uid needs root, and outside bwrap an interpreter that uid can execute."""
    return os.geteuid() == 0 and (mode == "bwrap" or _reachable(interpreter(mode)))


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
    pass_fds: tuple[int, ...] = ()  # fds the launcher inherits (the seccomp filter); ours to close after the start

    def started(self) -> None:
        """The launcher has its copies of pass_fds: close ours."""
        for fd in self.pass_fds:
            os.close(fd)
        self.pass_fds = ()

    def cleanup(self) -> None:
        self.started()
        if self.slot is not None:
            self.slot.release()
        if self.host_dir is not None:
            shutil.rmtree(self.host_dir, ignore_errors=True)


def prepare(mode: str, work_dir_mb: int, site: bool = False, extra_ro: tuple[str, ...] = ()) -> Launch:
    """Allocate the uid and work dir and build the command line for one execution in `mode`."""
    exe = interpreter(mode)
    slot = UidSlot() if uid_usable(mode) else None
    if slot is None and os.geteuid() == 0 and mode != "bwrap" and not os.environ.get("GLMSTACK_SANDBOX_UNSAFE_ROOT"):
        raise RuntimeError(
            f"sandbox: refusing to run untrusted code as root in {mode!r} mode: {exe} is not reachable by "
            "an unprivileged uid. Install bubblewrap, or set GLMSTACK_SANDBOX_PYTHON to a world-readable "
            "interpreter such as /usr/bin/python3 (or GLMSTACK_SANDBOX_UNSAFE_ROOT=1 to run as root anyway)."
        )
    layers = LAYERS[mode] + (("uid",) if slot else ())
    if mode != "bwrap" and deathsig_argv():  # plain: only the main process gets the death signal
        layers += ("no-new-privs", "die-with-parent" if mode == "unshare" else "main-dies-with-parent")
    uid = slot.uid if slot else None
    if mode == "bwrap":
        fd = seccomp.filter_fd()
        argv = bwrap_argv(work_dir_mb, extra_ro, seccomp_fd=fd) + python_argv(exe, site)
        layers += ("seccomp",) if fd is not None else ()
        return Launch(argv, "/", env_for(SANDBOX_DIR), layers, uid, None, slot, (fd,) if fd is not None else ())
    if uid is not None:
        clear_stale_work_dirs(uid)
    host_dir = tempfile.mkdtemp(prefix=f"glmstack-sandbox-{uid if uid is not None else 'u'}-")
    prefix = unshare_argv() if mode == "unshare" else deathsig_argv()
    return Launch(prefix + python_argv(exe, site), host_dir, env_for(host_dir), layers, uid, host_dir, slot)
