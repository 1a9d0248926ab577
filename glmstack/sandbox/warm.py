"""Warm sandboxes: one long-lived bwrap per worker, a fresh forked process per execution (root callers only).

    with WarmSandbox() as box:
        results = [box.run(code, timeout_s=5) for code in programs]     # one at a time per box
    run_batch(jobs, concurrency=2, warm=True)                           # one box per worker

Why: a cold run (run.py) starts bwrap and an interpreter every time, tens of ms of CPU on a 2-core machine; a
warm box forks its pre-started interpreter (zygote.py) instead. Every execution still gets a fresh process, its
own unprivileged uid (so RLIMIT_NPROC, the memory cgroup or watchdog and the kill-everything-of-the-uid sweep
work as in the cold path), its own mount namespace with fresh size- and inode-limited tmpfs at /sandbox, /tmp
and /dev/shm, rlimits, seccomp, a fresh keyring, no network, the read-only root. What it shares with the box's
earlier executions: the PID, network and IPC namespaces (a program can see processes of the box's current
execution only, as the last uid was swept).
"""

from __future__ import annotations

import os
import select
import signal
import socket
import struct
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from glmstack.sandbox import cgroup, isolation
from glmstack.sandbox.calls import CallPipe
from glmstack.sandbox.limits import Limits
from glmstack.sandbox.pump import encode_payload, memory_check, pump_while
from glmstack.sandbox.run import Result, make_result
from glmstack.sandbox.uids import UidSlot, kill_uid

ZYGOTE = Path(__file__).with_name("zygote.py").read_text()
REPLY_S = 10.0  # how long the zygote may take to report an execution it was told about, after its uid died


class ZygoteDied(RuntimeError):
    """The box's zygote went away mid-execution (killed from outside); `run` retries once on a new one."""


def warm_available() -> bool:
    """Warm boxes need bwrap and root (the zygote switches each execution to its own uid)."""
    return os.geteuid() == 0 and isolation.available("bwrap")


class WarmSandbox:
    """A zygote in a bwrap sandbox; `run` is `glmstack.sandbox.run` for it. Not thread-safe: one user at a time."""

    def __init__(self, *, work_dir_mb: int = Limits().work_dir_mb, site: bool = False, extra_ro=()):
        if not warm_available():
            raise RuntimeError("warm sandboxes need bubblewrap and root; use glmstack.sandbox.run")
        self._config = (work_dir_mb, tuple(extra_ro), site)
        self._proc: subprocess.Popen | None = None
        self._cgroup = self._cgroup_slot = None
        if cgroup.available():  # one memory cgroup for the box's executions, named after a uid slot it holds
            self._cgroup_slot = UidSlot()
            self._cgroup = cgroup.MemoryCgroup(self._cgroup_slot.uid, Limits().memory_mb, group_kill=False)
        self._start()

    def _argv(self, ctl_fd: int, cgroup_fd: int) -> list[str]:
        work_dir_mb, extra_ro, site = self._config
        argv = isolation.bwrap_argv(work_dir_mb, extra_ro, warm=True)
        argv += [isolation.interpreter("bwrap"), "-I", *([] if site else ["-S"]), "-c", ZYGOTE]
        return argv + [str(ctl_fd), isolation.BOOT, str(cgroup_fd), isolation.CODEC]

    def _start(self) -> None:
        """Start bwrap + zygote. With a cgroup the zygote joins it at once, so that its forks start inside:
        moving each execution in would cost an RCU grace period (~10 ms on a loaded machine, cgroup v1). Each
        fork raises its OOM score to the maximum (boot.py), so the OOM killer picks it, not the zygote."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        cg_fd = self._cgroup.procs_fd() if self._cgroup else -1
        fds = (theirs.fileno(), *([cg_fd] if cg_fd >= 0 else []))
        try:
            self._proc = subprocess.Popen(
                self._argv(theirs.fileno(), cg_fd), cwd="/", env=isolation.env_for(isolation.SANDBOX_DIR),
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                pass_fds=fds, start_new_session=True,
            )  # fmt: skip
        finally:
            theirs.close()
            if cg_fd >= 0:
                os.close(cg_fd)
        self._ctl = ours
        memory = cgroup.layer() or "memory-watchdog"
        self.layers = (
            *isolation.LAYERS["bwrap"],
            *isolation.kernel_layers(),
            "uid",
            memory,
            "tmpfs-inodes",
            "warm-fork",
        )

    def close(self) -> None:
        """Stop the zygote (closing its socket ends it; SIGKILL if it lingers) and remove the box's cgroup."""
        if self._proc is None:
            return
        self._ctl.close()
        try:
            self._proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()
        self._proc = None
        if self._cgroup is not None:
            self._cgroup.remove()
            self._cgroup_slot.release()

    def _restart(self) -> None:
        if self._proc is not None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._proc.wait()
            self._ctl.close()
        self._start()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _submit(self, extra: list[int]) -> tuple[int, int, int]:
        """Ask the zygote for an execution, handing it `extra` fds (its fds 3, 4, ...); returns our pipe ends
        (stdin to write, stdout, stderr)."""
        if self._proc.poll() is not None:  # bwrap is gone (killed from outside?): start a new box
            self._restart()
        (r_in, w_in), (r_out, w_out), (r_err, w_err) = os.pipe(), os.pipe(), os.pipe()
        try:
            try:
                socket.send_fds(self._ctl, [b"x"], [r_in, w_out, w_err, *extra])
            except OSError:  # the zygote died but bwrap did not notice yet
                self._restart()
                socket.send_fds(self._ctl, [b"x"], [r_in, w_out, w_err, *extra])
        finally:
            for fd in (r_in, w_out, w_err):
                os.close(fd)
        return w_in, r_out, r_err

    def _reply(self, timeout: float) -> int | None:
        """The zygote's exit code for the current execution, if it arrives within `timeout`."""
        if not select.select([self._ctl], [], [], timeout)[0]:
            return None
        data = self._ctl.recv(4)
        if len(data) != 4:
            raise ZygoteDied("sandbox zygote died")
        return struct.unpack("i", data)[0]

    def _settle(self, wait_exit, status: list) -> None:
        """After killing an execution's uid, take the zygote's report; a zygote that gives none is replaced."""
        try:
            if wait_exit(REPLY_S):
                return
        except ZygoteDied:
            pass
        self._restart()
        status.append(-signal.SIGKILL)

    def run(
        self, code: str, *, stdin=None, files=None, argv=(), limits: Limits | None = None,
        driver: Callable[[CallPipe], None] | None = None, **overrides,
    ) -> Result:  # fmt: skip
        """Like `glmstack.sandbox.run` (same keywords, same Result), in this box."""
        limits = (limits or Limits()).replace(**overrides)
        try:
            return self._run(code, stdin, files, argv, limits, driver)
        except ZygoteDied:  # _settle has started a new zygote
            return self._run(code, stdin, files, argv, limits, driver)

    def _run(self, code: str, stdin, files, argv, limits: Limits, driver) -> Result:
        launch = isolation.Launch([], "/", {}, self.layers, {}, None, None, UidSlot())
        launch.uid = launch.slot.uid
        start, status = time.monotonic(), []
        pipe = CallPipe(start + limits.timeout_s) if driver is not None else None
        try:
            if self._cgroup is not None:
                self._cgroup.arm(limits.memory_mb)
            launch.boot = isolation.boot_settings(
                limits, launch.uid, mounts=isolation.scratch(limits, warm=True), new_mount_ns=True,
                callee=(3, 4) if pipe else None,  # the zygote's fork gets the extra fds as 3, 4, ...
                oom_first=self._cgroup is not None,
            )  # fmt: skip
            payload = encode_payload(code, stdin, files, argv, launch.boot)
            fds = self._submit(list(pipe.theirs) if pipe else [])
            if pipe is not None:
                pipe.started()
            return self._execute(launch, fds, payload, limits, start, status, driver, pipe)
        finally:
            launch.cleanup()
            if pipe is not None:
                pipe.close()

    def _execute(self, launch, fds, payload: bytes, limits: Limits, start: float, status: list, driver, pipe):
        def wait_exit(timeout: float) -> bool:
            if not status and (code_ := self._reply(timeout)) is not None:
                status.append(code_)
            return bool(status)

        out, err, why = b"", b"", "interrupted"
        try:
            args = (fds, payload, limits, memory_check(launch.uid, self._cgroup, limits), wait_exit)
            out, err, why = pump_while(driver, pipe, lambda: kill_uid(launch.uid), *args)
        finally:  # nothing of this execution may run when we return, or when the zygote serves the next one
            if not status:
                kill_uid(launch.uid)
                self._settle(wait_exit, status)
        if why == "exit" and self._cgroup is not None and self._cgroup.oom_killed():
            why = "memory"
        duration = time.monotonic() - start
        return make_result(
            out, err, why, status[0], duration_s=duration, mode="bwrap", layers=self.layers, uid=launch.uid,
            work_dir=None,
        )  # fmt: skip
