"""Warm sandboxes: one long-lived bwrap per worker, a fresh forked process per execution (root callers only).

    with WarmSandbox() as box:
        results = [box.run(code, timeout_s=5) for code in programs]     # one at a time per box
    run_batch(jobs, concurrency=2, warm=True)                           # one box per worker

Why: a cold run (run.py) starts bwrap and an interpreter every time, tens of ms of CPU on a 2-core machine; a
warm box forks its pre-started interpreter (zygote.py) instead. Every execution still gets a fresh process, its
own unprivileged uid (so RLIMIT_NPROC, the memory watchdog and the kill-everything-of-the-uid sweep work as in
the cold path), its own empty work dir, rlimits, no network, the read-only root. What it shares with the box's
earlier executions: the namespaces (a program can see processes of the box's current execution only, as the
last uid was swept), the tmpfs size limit, and /tmp and /dev/shm, which the zygote empties between executions.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import struct
import subprocess
import time
from pathlib import Path

from glmstack.sandbox import isolation, seccomp
from glmstack.sandbox.limits import Limits
from glmstack.sandbox.pump import encode_payload, pump
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
        self._start()

    def _argv(self, ctl_fd: int, seccomp_fd: int | None) -> list[str]:
        work_dir_mb, extra_ro, site = self._config
        # The zygote also empties the shared dirs, whose entries belong to the sandbox uids: it needs to pass
        # their permissions (CAP_DAC_OVERRIDE, CAP_FOWNER). Each execution drops every capability at its uid switch.
        argv = isolation.bwrap_argv(work_dir_mb, extra_ro, warm=True, seccomp_fd=seccomp_fd)
        argv += ["--cap-add", "CAP_DAC_OVERRIDE", "--cap-add", "CAP_FOWNER"]
        argv += [isolation.interpreter("bwrap"), "-I", *([] if site else ["-S"]), "-c", ZYGOTE]
        return argv + [str(ctl_fd), isolation.BOOT]

    def _start(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        seccomp_fd = seccomp.filter_fd()
        fds = (theirs.fileno(), *([seccomp_fd] if seccomp_fd is not None else []))
        try:
            self._proc = subprocess.Popen(
                self._argv(theirs.fileno(), seccomp_fd), cwd="/", env=isolation.env_for(isolation.SANDBOX_DIR),
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, pass_fds=fds,
                start_new_session=True,
            )  # fmt: skip
        finally:
            theirs.close()
            if seccomp_fd is not None:
                os.close(seccomp_fd)
        self._ctl = ours
        self.layers = (*isolation.LAYERS["bwrap"], "uid", "warm-fork", *(["seccomp"] if seccomp_fd is not None else []))

    def close(self) -> None:
        """Stop the zygote (closing its socket ends it; SIGKILL if it lingers)."""
        if self._proc is None:
            return
        self._ctl.close()
        try:
            self._proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()
        self._proc = None

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

    def _submit(self, uid: int) -> tuple[int, int, int]:
        """Ask the zygote for an execution as `uid`; returns our pipe ends (stdin to write, stdout, stderr)."""
        if self._proc.poll() is not None:  # bwrap is gone (killed from outside?): start a new box
            self._restart()
        (r_in, w_in), (r_out, w_out), (r_err, w_err) = os.pipe(), os.pipe(), os.pipe()
        try:
            try:
                socket.send_fds(self._ctl, [str(uid).encode()], [r_in, w_out, w_err])
            except OSError:  # the zygote died but bwrap did not notice yet
                self._restart()
                socket.send_fds(self._ctl, [str(uid).encode()], [r_in, w_out, w_err])
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

    def run(self, code: str, *, stdin=None, files=None, argv=(), limits: Limits | None = None, **overrides) -> Result:
        """Like `glmstack.sandbox.run` (same keywords, same Result), in this box."""
        limits = (limits or Limits()).replace(**overrides)
        try:
            return self._run(code, stdin, files, argv, limits)
        except ZygoteDied:  # _settle has started a new zygote
            return self._run(code, stdin, files, argv, limits)

    def _run(self, code: str, stdin, files, argv, limits: Limits) -> Result:
        slot = UidSlot()
        payload = encode_payload(code, stdin, files, argv, limits.rlimits(), slot.uid, False)
        start, status = time.monotonic(), []
        try:
            fds = self._submit(slot.uid)
        except BaseException:
            slot.release()
            raise

        def wait_exit(timeout: float) -> bool:
            if not status and (code_ := self._reply(timeout)) is not None:
                status.append(code_)
            return bool(status)

        out, err, why = b"", b"", "interrupted"
        try:
            out, err, why = pump(fds, payload, limits, slot.uid, wait_exit)
        finally:  # nothing of this execution may run when we return, or when the zygote serves the next one
            try:
                if not status:
                    kill_uid(slot.uid)
                    self._settle(wait_exit, status)
            finally:
                slot.release()
        duration = time.monotonic() - start
        return make_result(
            out, err, why, status[0], duration_s=duration, mode="bwrap", layers=self.layers, uid=slot.uid, work_dir=None
        )
