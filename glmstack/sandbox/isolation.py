"""How a sandboxed process is launched: the isolation mode, its command line, the sandbox uid, and cleanup.

Three modes, strongest first; `auto` picks the first that works on this host (probed once per process):

- `bwrap`   bubblewrap: new PID, network, IPC, UTS and mount namespaces; a fresh root that holds only the
            interpreter and the system libraries, read-only; a tmpfs work dir at /sandbox (/tmp points there);
            --die-with-parent. Killing bwrap kills the namespace's init, and the kernel then kills every process
            in the namespace, so setsid + double fork cannot outlive a run.
- `unshare` util-linux unshare (root only): new PID, network, IPC, UTS and mount namespaces, and boot.py builds
            the same file view as bwrap inside (the `view` list below is rendered both ways), mounts a private
            /proc and pivots into it; --kill-child plays --die-with-parent.
- `plain`   a fresh process in its own session; nothing else from the kernel. Only on explicit request, or with
            a warning when `auto` finds nothing better.

In every mode: rlimits (limits.py), a scrubbed environment, an empty work dir, a wall-clock kill, the seccomp
filter (seccomp.py), a fresh session keyring, no_new_privs (all set by boot.py), and, when we are root, a
dedicated unprivileged uid per execution (held with a lock file so concurrent runners never share one), a
memory cgroup counting all of its memory (cgroup.py; else a resident-set watchdog), and writable dirs that are
tmpfs limited in size and inodes. RLIMIT_NPROC counts per uid and is ignored for root, so the uid is what makes
the process limit bite; after each run every process of that uid is killed (uids.py). warm.py reuses one bwrap
for many executions. docs/sandbox.md has the full table.
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

from glmstack.sandbox import cgroup, seccomp
from glmstack.sandbox.limits import Limits
from glmstack.sandbox.uids import UidSlot, clear_stale_work_dirs, kill_uid, remove_ipc, remove_tree

BOOT = (Path(__file__).with_name("boot.py")).read_text()
CODEC = (Path(__file__).with_name("plain.py")).read_text()  # the candidate side's encoder (verifier.py)
SANDBOX_DIR = "/sandbox"
NAMESPACES = "--unshare-pid --unshare-net --unshare-ipc --unshare-uts --unshare-cgroup-try --die-with-parent --new-session --hostname sandbox"
SYSTEM_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3")  # fallbacks a sandbox uid can usually run
MODES = ("bwrap", "unshare", "plain")
CONFINED = ("pid-ns", "net-ns", "ipc-ns", "mount-ns", "ro-root", "hidden-host-files", "private-proc", "tmpfs-workdir")
LAYERS = {
    "bwrap": ("process", "rlimits", "session", "clean-env", "workdir", *CONFINED, "die-with-parent", "no-new-privs"),
    "unshare": ("process", "rlimits", "session", "clean-env", "workdir", *CONFINED, "no-new-privs"),
    "plain": ("process", "rlimits", "session", "clean-env", "workdir", "no-new-privs"),
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


def file_view(extra: tuple[str, ...] = (), tmp_link: bool = True) -> list[tuple[str, ...]]:
    """The sandbox's file system, as ops that bwrap_argv renders for bwrap and boot.py mounts in unshare mode:
    ("ro-bind" | "ro-bind-try", host path, path inside), ("symlink", target, link), ("dir", path) made 0755.
    The system dirs, a few /etc files, the interpreter's prefix and `extra`, every ancestor made 0755 (so a
    pyenv under /root is reachable without the rest of /root); /proc, /dev and the writable tmpfs come apart."""
    ops: list[tuple[str, ...]] = []
    for top in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            ops.append(("symlink", os.readlink(top), top))
        elif os.path.isdir(top):
            ops.append(("ro-bind", top, top))
    ops.append(("dir", "/etc"))
    ops += [
        ("ro-bind-try", f, f) for f in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/localtime", "/etc/alternatives")
    ]
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
                ops.append(("dir", str(parent)))
        ops.append(("ro-bind", path, path))
    return ops + ([("symlink", SANDBOX_DIR, "/tmp")] if tmp_link else [])


def _render(op: tuple[str, ...]) -> list[str]:
    kind, *args = op
    return ["--perms", "0755", "--dir", *args] if kind == "dir" else [f"--{kind}", *args]


def bwrap_argv(work_dir_mb: int, extra_ro: tuple[str, ...] = (), warm: bool = False) -> list[str]:
    """The bwrap prefix of the command line; the program then runs as `python -I -S -c BOOT`. `warm`: for a
    zygote (warm.py), whose forks mount their own /sandbox, /tmp and /dev/shm over these."""
    size = str(work_dir_mb << 20)
    args = ["bwrap", *NAMESPACES.split()]
    if os.geteuid() == 0:  # a root bwrap keeps all of root's capabilities unless told; boot.py needs only these
        args += ["--cap-drop", "ALL"]
        for cap in ("CAP_SETUID", "CAP_SETGID", "CAP_CHOWN", "CAP_SYS_ADMIN"):  # SYS_ADMIN: its tmpfs mounts
            args += ["--cap-add", cap]
    for op in file_view(extra_ro, tmp_link=not warm):
        args += _render(op)
    args += ["--proc", "/proc", "--dev", "/dev", "--size", size, "--perms", "1777", "--tmpfs", "/dev/shm"]
    args += ["--size", size, "--tmpfs", SANDBOX_DIR]
    args += ["--size", size, "--perms", "1777", "--tmpfs", "/tmp"] if warm else []
    return args + ["--remount-ro", "/", "--chdir", SANDBOX_DIR]


def scratch(limits: Limits, warm: bool = False) -> list[tuple[str, str, str]]:
    """The writable tmpfs boot.py mounts as root: size- and inode-limited (bwrap's --tmpfs has no inode limit).
    ("tmpfs", path, options) or ("bind", path, source); the work dir comes first (boot.py enters it)."""
    opts = f"size={limits.work_dir_mb << 20},nr_inodes={limits.max_files}"
    work = [("tmpfs", SANDBOX_DIR, f"mode=0755,{opts}")] + ([("bind", "/tmp", SANDBOX_DIR)] if warm else [])
    return work + [("tmpfs", "/dev/shm", f"mode=1777,{opts}")]


def deathsig_argv() -> list[str]:
    """Outside bwrap, via util-linux setpriv: SIGKILL the launched process when its parent (us) dies, and set
    no_new_privs so no setuid binary on the host (su, sudo, ...) can give the program privileges back
    (bwrap sets no_new_privs itself)."""
    return ["setpriv", "--pdeathsig", "KILL", "--no-new-privs"] if shutil.which("setpriv") else []


def unshare_argv() -> list[str]:
    # --kill-child: when unshare dies (e.g. of the death signal above), the namespace's init and all in it die
    return [*deathsig_argv(), "unshare", "--pid", "--net", "--ipc", "--uts", "--mount", "--fork", "--kill-child"]


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
    if mode == "unshare":  # boot.py builds the file view with pivot_root, whose number we need
        ok = os.geteuid() == 0 and shutil.which("unshare") is not None and "pivot_root" in seccomp.numbers()
        return ok and _probe(unshare_argv())
    return mode == "plain"


@functools.cache
def resolve(mode: str = "auto") -> str:
    """`auto` -> the strongest available mode (env GLMSTACK_SANDBOX forces one); warns once when that is plain,
    which has no namespaces or file view: plain is otherwise only ever an explicit choice."""
    mode = os.environ.get("GLMSTACK_SANDBOX", mode) if mode == "auto" else mode
    if mode not in ("auto", *MODES):
        raise ValueError(f"sandbox mode must be auto or one of {MODES}, got {mode!r}")
    if mode != "auto":
        if not available(mode):
            raise RuntimeError(f"sandbox mode {mode!r} is not available on this host (see docs/sandbox.md)")
        return mode
    chosen = next(m for m in MODES if available(m))
    if chosen == "plain":
        warnings.warn(
            "sandbox: neither bubblewrap nor unshare (as root) is available; running untrusted code in the "
            "weak 'plain' mode: host files readable, network reachable, no PID namespace (docs/sandbox.md)",
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
    """The interpreter for this run: python_exe(), except that in plain mode a root caller needs one the sandbox
    uid can execute, so an unreachable default (e.g. pyenv under /root, mode 0700) falls back to a system
    python3, with a warning. An explicit GLMSTACK_SANDBOX_PYTHON is never replaced."""
    exe = python_exe()
    if mode != "plain" or os.geteuid() != 0 or _reachable(exe) or os.environ.get("GLMSTACK_SANDBOX_PYTHON"):
        return exe
    for candidate in SYSTEM_PYTHONS:
        if _reachable(os.path.realpath(candidate)):
            _warn_once(f"sandbox: {exe} is not reachable by the sandbox uid; running {candidate} instead")
            return os.path.realpath(candidate)
    return exe


def uid_usable(mode: str) -> bool:
    """A dedicated uid needs root, and in plain mode an interpreter that uid can execute (the other modes bind
    the interpreter into a view whose directories are all 0755)."""
    return os.geteuid() == 0 and (mode != "plain" or _reachable(interpreter(mode)))


def boot_settings(
    limits: Limits, uid: int | None, *, nproc: int | None = None, root: list | None = None, mounts: list | None = None,
    new_mount_ns: bool = False, cgroup_fd: int | None = None, callee: tuple[int, int] | None = None,
    deathsig: bool = False, oom_first: bool = False,
) -> dict:  # fmt: skip
    """What boot.py needs besides the program, files and stdin (see its docstring for the order it applies them).
    `callee`: the fds (inside the sandbox) on which the program serves the verifier's calls (calls.py)."""
    numbers = seccomp.numbers()
    return {
        "rlimits": limits.rlimits(nproc), "uid": uid, "deathsig": deathsig, "root": root, "scratch": mounts,
        "new_mount_ns": new_mount_ns, "cgroup_fd": cgroup_fd, "oom_first": oom_first, "callee": callee,
        "codec": CODEC if callee is not None else None,
        "seccomp": seccomp.program(),
        "keyring": "keyctl" in numbers, "nr": numbers,
    }  # fmt: skip


def kernel_layers() -> tuple[str, ...]:
    numbers = seccomp.numbers()
    return (*(["seccomp"] if seccomp.program() else []), *(["session-keyring"] if "keyctl" in numbers else []))


def memory_layers(uid: int | None, cg: cgroup.MemoryCgroup | None) -> tuple[str, ...]:
    if cg is not None:
        return (f"memory-cgroup-v{cg.version}",)
    return ("memory-watchdog",) if uid is not None else ()


@dataclass
class Launch:
    """Everything run.py needs to start one execution and clean up after it."""

    argv: list[str]
    cwd: str
    env: dict[str, str]
    layers: tuple[str, ...]
    boot: dict  # boot_settings for the payload
    uid: int | None = None  # the sandbox uid boot.py switches to (None: we are not root, keep ours)
    host_dir: str | None = None  # host temp work dir to remove afterwards (plain)
    slot: UidSlot | None = field(default=None, repr=False)
    cgroup: cgroup.MemoryCgroup | None = field(default=None, repr=False)
    pass_fds: tuple[int, ...] = ()  # fds the launcher inherits; ours to close after the start

    def started(self) -> None:
        """The launcher has its copies of pass_fds: close ours."""
        for fd in self.pass_fds:
            os.close(fd)
        self.pass_fds = ()

    def cleanup(self) -> None:
        self.started()
        try:
            if self.host_dir is not None and self.uid is not None:  # plain: the host's IPC namespace
                kill_uid(self.uid)
                remove_ipc(self.uid)
            if self.slot is not None:
                self.slot.release()  # kills every process of the uid first
            if self.cgroup is not None:
                self.cgroup.remove()
        finally:
            if self.host_dir is not None:
                remove_tree(self.host_dir)


def prepare(
    mode: str, limits: Limits, site: bool = False, extra_ro: tuple[str, ...] = (), callee: tuple[int, int] | None = None
) -> Launch:
    """Allocate the uid, memory cgroup and work dir, and build the command line for `mode`; `callee` are the
    candidate's ends of the verifier's call pipes (calls.py), passed through to the program."""
    exe = interpreter(mode)
    slot = UidSlot() if uid_usable(mode) else None
    if slot is None and os.geteuid() == 0 and mode == "plain" and not os.environ.get("GLMSTACK_SANDBOX_UNSAFE_ROOT"):
        raise RuntimeError(
            f"sandbox: refusing to run untrusted code as root in plain mode: {exe} is not reachable by "
            "an unprivileged uid. Install bubblewrap, or set GLMSTACK_SANDBOX_PYTHON to a world-readable "
            "interpreter such as /usr/bin/python3 (or GLMSTACK_SANDBOX_UNSAFE_ROOT=1 to run as root anyway)."
        )
    uid = slot.uid if slot else None
    launch = Launch([], "/", env_for(SANDBOX_DIR), (), {}, uid, None, slot)
    try:
        _fill(launch, mode, limits, exe, site, tuple(extra_ro), callee)
    except BaseException:
        launch.cleanup()
        raise
    return launch


def _fill(launch: Launch, mode: str, limits: Limits, exe: str, site: bool, extra_ro: tuple, callee) -> None:
    uid, fds = launch.uid, []
    if uid is not None and cgroup.available():
        launch.cgroup = cgroup.MemoryCgroup(uid, limits.memory_mb)
    cg_fd = launch.cgroup.procs_fd() if launch.cgroup else None
    fds += [cg_fd] if cg_fd is not None else []
    launch.pass_fds = tuple(fds)  # ours to close once started; callee fds belong to the caller (calls.py)
    root = os.geteuid() == 0
    # Without our own uid, RLIMIT_NPROC counts every process of the caller's user: allow those plus ours.
    nproc = None if uid is not None or root else _user_process_count() + limits.max_processes
    deathsig = mode != "bwrap" and bool(deathsig_argv())
    layers = LAYERS[mode] + kernel_layers() + (("uid",) if uid is not None else ()) + memory_layers(uid, launch.cgroup)
    if mode != "bwrap" and deathsig:  # plain: only the main process gets the death signal
        layers += ("die-with-parent" if mode == "unshare" else "main-dies-with-parent",)
    kw = {"nproc": nproc, "cgroup_fd": cg_fd, "callee": callee, "deathsig": deathsig}
    if mode == "bwrap":
        launch.argv = bwrap_argv(limits.work_dir_mb, extra_ro) + python_argv(exe, site)
        launch.boot = boot_settings(limits, uid, mounts=scratch(limits) if root else None, **kw)
        layers += ("tmpfs-inodes",) if root else ()
    elif mode == "unshare":
        launch.argv = unshare_argv() + python_argv(exe, site)
        launch.boot = boot_settings(limits, uid, root=file_view(extra_ro), mounts=scratch(limits), **kw)
        layers += ("tmpfs-inodes",)
    else:
        if uid is not None:
            clear_stale_work_dirs(uid)
        launch.host_dir = tempfile.mkdtemp(prefix=f"glmstack-sandbox-{uid if uid is not None else 'u'}-")
        launch.cwd, launch.env = launch.host_dir, env_for(launch.host_dir)
        launch.argv = deathsig_argv() + python_argv(exe, site)
        launch.boot = boot_settings(limits, uid, **kw)
    launch.layers = layers


def _user_process_count() -> int:
    uid = os.getuid()
    return sum(1 for p in os.listdir("/proc") if p.isdigit() and _owner(p) == uid)


def _owner(pid: str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None
