"""Sandbox uids: one unprivileged uid per execution, and finding, measuring and killing its processes.

Why a uid of its own: RLIMIT_NPROC counts processes per real uid and is not enforced for root, so a root
caller's fork-bomb limit only bites on a fresh non-root uid; and since a process cannot change its uid back,
"every process of that uid" is exactly the sandbox, whatever it did (setsid, double fork, reparenting), which
gives the sweep after each run and the resident-memory watchdog. Uids are UID_BASE + slot, far above real
accounts; a slot is held with an flock in LOCK_DIR, so concurrent runners (threads or other processes) never
share one, and a free lock proves that a uid's leftover work dirs and processes belong to a dead runner.
"""

from __future__ import annotations

import fcntl
import itertools
import os
import random
import signal
import stat
import tempfile
import time
import warnings
from pathlib import Path

UID_BASE, UID_SLOTS = 2_000_000_000, 4096  # uid_t is 32-bit
LOCK_DIR = Path(tempfile.gettempdir()) / "glmstack-sandbox-uids"
PAGE = os.sysconf("SC_PAGE_SIZE")


def sigkill(pids) -> None:
    """SIGKILL each pid; one that already exited is fine (shared by the uid and cgroup reapers)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _ensure_lock_dir() -> None:
    """LOCK_DIR lives in the shared /tmp: make sure it is ours (not another user's dir or symlink) before a root
    process creates files in it."""
    LOCK_DIR.mkdir(mode=0o700, exist_ok=True)
    st = os.lstat(LOCK_DIR)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise RuntimeError(f"sandbox: {LOCK_DIR} is not a private directory of ours; remove it")


class UidSlot:
    """An exclusive unprivileged uid for one execution, held by an flock so other runners skip it."""

    def __init__(self):
        _ensure_lock_dir()
        for slot in random.sample(range(UID_SLOTS), 64):
            fd = os.open(LOCK_DIR / f"{slot}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
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
        sigkill(pids)
        time.sleep(min(0.001 * rnd, 0.02))


def is_free(uid: int) -> bool:
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
    """Remove host work dirs, and kill processes, left by runners killed before their cleanup (outside the
    namespaced modes a program's children can outlive a SIGKILLed runner). Dirs are named by uid, and a uid whose
    lock is free (or our own, whose lock we hold) has no live runner. Anything else in /tmp with a similar name
    (a program may plant one) is left alone: this must never fail."""
    for d in Path(tempfile.gettempdir()).glob("glmstack-sandbox-[0-9]*-*"):
        try:
            uid = int(d.name.split("-")[2])
            st = os.lstat(d)
        except (ValueError, IndexError, OSError):
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid not in (uid, os.geteuid()):
            continue  # not one of ours: leave other users' files alone
        if uid == own_uid or is_free(uid):
            kill_uid(uid)
            remove_tree(str(d))


def remove_tree(path: str) -> None:
    """`rm -rf path` that survives whatever a program left there: any depth (a 3000-deep tree breaks
    shutil.rmtree's recursion and PATH_MAX), dirs without permissions, entries vanishing meanwhile. A loop, not
    a recursion: it holds one directory fd and the stack of names from `path` down, and climbs back by "..".
    Only for trees nobody changes any more (every process of the uid is dead)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return
    except OSError:  # a file or a symlink, not a dir
        _ignore_missing(os.unlink, path)
        return
    names: list[str] = []
    while True:
        sub = _first_subdir_after_unlinking_the_rest(fd)
        if sub is not None:
            try:
                child = os.open(sub, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except PermissionError:  # a dir the program made unreadable (we are not root)
                os.chmod(sub, 0o700, dir_fd=fd)
                continue
            os.close(fd)
            fd = child
            names.append(sub)
            continue
        if not names:
            break
        parent = os.open("..", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = parent
        _ignore_missing(os.rmdir, names.pop(), dir_fd=fd)
    os.close(fd)
    _ignore_missing(os.rmdir, path)


def _first_subdir_after_unlinking_the_rest(fd: int) -> str | None:
    with os.scandir(fd) as entries:
        for e in entries:
            if e.is_dir(follow_symlinks=False):
                return e.name
            _ignore_missing(os.unlink, e.name, dir_fd=fd)
    return None


def _ignore_missing(fn, *args, **kw) -> None:
    try:
        fn(*args, **kw)
    except FileNotFoundError:
        pass


def remove_ipc(uid: int) -> None:
    """Remove the SysV shared memory, message queues and semaphores `uid` left in the host's IPC namespace
    (plain mode; the other modes' IPC namespace dies with the run). They outlive their processes otherwise."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for kind, remove in (
        ("shm", lambda i: libc.shmctl(i, 0, None)),
        ("msg", lambda i: libc.msgctl(i, 0, None)),
        ("sem", lambda i: libc.semctl(i, 0, 0)),
    ):  # fmt: skip  -- IPC_RMID = 0
        try:
            with open(f"/proc/sysvipc/{kind}") as f:
                header, *rows = [line.split() for line in f]
        except OSError:
            continue
        for row in rows:
            entry = dict(zip(header, row))
            if entry.get("uid") == str(uid) or entry.get("cuid") == str(uid):
                remove(int(row[1]))  # the second column is the id (shmid, msqid, semid)
