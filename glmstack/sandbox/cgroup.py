"""A memory cgroup per execution: counts all of a run's memory, not only its resident set.

Why: RLIMIT_AS bounds one process's address space and the resident-set watchdog sums its processes' RSS, but
SysV shared memory, memfds, tmpfs files and kernel memory (an inode flood: ~1 KB per empty file) are none of
these; with `memory_mb=256` a program held 1.5 GB through them (issue 26). A memory cgroup charges every page
the run allocates, whatever holds it: the kernel OOM-kills inside the cgroup at `memory_mb`, and we flag `oom`
when its OOM counter moves.

How: as root, per cold execution, a cgroup named after the sandbox uid under `glmstack-sandbox/` of the memory
hierarchy, with the limit set and swap off. The parent opens its `cgroup.procs` and hands the fd to boot.py,
which writes "0" (itself) before it runs anything untrusted, so every process of the program starts inside. A
warm box (warm.py) keeps one cgroup that its zygote joins once, and re-arms it before each execution.
cgroup v2 (`memory.max`, `memory.swap.max`, `memory.oom.group`, `memory.events`) when the unified hierarchy has
the memory controller, else cgroup v1 (`memory.limit_in_bytes`, `memory.oom_control`). Without either (no root,
no writable hierarchy, or env GLMSTACK_SANDBOX_CGROUP=off) `available()` is None and the uid's resident-set
watchdog (pump.py) is the fallback. The layer in `Result.layers`: memory-cgroup-v2 | memory-cgroup-v1 |
memory-watchdog.
"""

from __future__ import annotations

import errno
import functools
import os
import time

from glmstack.sandbox.uids import sigkill

PARENT = "glmstack-sandbox"


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, fs type, super options) of the cgroup hierarchies, from /proc/self/mountinfo."""
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            sep = fields.index("-")
            fstype, opts = fields[sep + 1], set(fields[sep + 3].split(","))
            if fstype in ("cgroup", "cgroup2"):
                found.append((fields[4], fstype, opts))
    return found


def _write(path: str, value: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _v2_parent(root: str) -> str | None:
    """Our parent under a cgroup2 mount whose root can delegate the memory controller, or None."""
    with open(os.path.join(root, "cgroup.controllers")) as f:
        if "memory" not in f.read().split():
            return None
    with open(os.path.join(root, "cgroup.subtree_control")) as f:
        if "memory" not in f.read().split():
            _write(os.path.join(root, "cgroup.subtree_control"), "+memory")  # EBUSY where processes live in it
    parent = os.path.join(root, PARENT)
    os.makedirs(parent, exist_ok=True)
    _write(os.path.join(parent, "cgroup.subtree_control"), "+memory")
    return parent


@functools.cache
def _has(parent: str, name: str) -> bool:
    """Whether the per-run cgroups under `parent` have control file `name` (swap accounting is optional)."""
    probe = os.path.join(parent, f"probe-{os.getpid()}")
    os.makedirs(probe, exist_ok=True)
    try:
        return os.path.exists(os.path.join(probe, name))
    finally:
        os.rmdir(probe)


@functools.cache
def available() -> tuple[str, int] | None:
    """(parent directory of the per-run cgroups, cgroup version), or None where we cannot make them."""
    if os.environ.get("GLMSTACK_SANDBOX_CGROUP") == "off" or os.geteuid() != 0:
        return None
    try:
        mounts = _mounts()
        for point, fstype, _ in mounts:
            if fstype == "cgroup2" and (parent := _v2_parent(point)):
                _clear_stale(parent)
                return parent, 2
        for point, fstype, opts in mounts:
            if fstype == "cgroup" and "memory" in opts:
                parent = os.path.join(point, PARENT)
                os.makedirs(parent, exist_ok=True)
                _clear_stale(parent)
                return parent, 1
    except OSError:
        pass
    return None


def _clear_stale(parent: str) -> None:
    """Remove the cgroups of runners that were killed before their cleanup (their uid lock is free)."""
    from glmstack.sandbox.uids import is_free

    for name in os.listdir(parent):
        if name.isdigit() and is_free(int(name)):
            try:
                _remove(os.path.join(parent, name))
            except OSError:
                pass


def layer() -> str | None:
    got = available()
    return f"memory-cgroup-v{got[1]}" if got else None


def _kill_members(path: str) -> None:
    for _ in range(50):
        try:
            with open(os.path.join(path, "cgroup.procs")) as f:
                pids = [int(p) for p in f.read().split()]
        except OSError:
            return
        if not pids:
            return
        sigkill(pids)
        time.sleep(0.01)


def _remove(path: str) -> None:
    """rmdir the cgroup once its processes are gone (a killed process leaves it a moment later)."""
    for attempt in range(200):
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError as e:
            if e.errno != errno.EBUSY:
                raise
            _kill_members(path)
            time.sleep(min(0.001 * (attempt + 1), 0.02))


class MemoryCgroup:
    """A memory cgroup named after a held uid slot; `procs_fd()` is what boot.py joins. A cold run has one of
    its own; a warm box keeps one for all its (sequential) executions, re-armed before each: making and removing
    a cgroup per execution would cost more than the rest of a warm execution's setup."""

    def __init__(self, uid: int, memory_mb: int, group_kill: bool = True):
        self.parent, self.version = available()
        self.path = os.path.join(self.parent, str(uid))
        try:
            os.mkdir(self.path)
        except FileExistsError:  # left by a runner that was SIGKILLed: our uid lock proves it is dead
            _remove(self.path)
            os.mkdir(self.path)
        v2 = self.version == 2
        self._usage = os.path.join(self.path, "memory.current" if v2 else "memory.usage_in_bytes")
        self._events = os.path.join(self.path, "memory.events" if v2 else "memory.oom_control")
        self._limits = ["memory.max"] if v2 else ["memory.limit_in_bytes"]
        if v2:
            if group_kill:  # an OOM kill takes the whole run (not for a warm box: its zygote lives there too)
                _write(os.path.join(self.path, "memory.oom.group"), "1")
            if _has(self.parent, "memory.swap.max"):
                _write(os.path.join(self.path, "memory.swap.max"), "0")
        elif _has(self.parent, "memory.memsw.limit_in_bytes"):
            self._limits.append("memory.memsw.limit_in_bytes")  # memory + swap: no swapping past the limit
        self._ooms = 0
        self.arm(memory_mb)

    def arm(self, memory_mb: int) -> None:
        """Allow `memory_mb` more than what is charged now (page cache an earlier execution left), and count OOM
        kills from here on. Call it with no process of the run in the cgroup."""
        with open(self._usage) as f:
            limit = int(f.read()) + (memory_mb << 20)
        for name in self._limits[::-1] if self._raising(limit) else self._limits:  # v1: memsw >= memory always
            _write(os.path.join(self.path, name), str(limit))
        self._ooms = self._oom_count()

    def _raising(self, limit: int) -> bool:
        with open(os.path.join(self.path, self._limits[0])) as f:
            current = f.read().strip()
        return current == "max" or int(current) < limit

    def procs_fd(self) -> int:
        return os.open(os.path.join(self.path, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)

    def _oom_count(self) -> int:
        try:
            fd = os.open(self._events, os.O_RDONLY)
            try:
                text = os.read(fd, 4096)
            finally:
                os.close(fd)
        except OSError:
            return 0
        _, found, rest = text.partition(b"\noom_kill ")  # not the first line in either version
        return int(rest.split()[0]) if found else 0

    def oom_killed(self) -> bool:
        """Whether the kernel OOM-killed a process of the run since `arm` (its memory passed the limit)."""
        return self._oom_count() > self._ooms

    def remove(self) -> None:
        _remove(self.path)
