"""Run one piece of model-written Python in the sandbox and report what happened.

    from glmstack.sandbox import run
    r = run("print(input()[::-1])", stdin="abc", timeout_s=2)
    r.stdout, r.exit_code, r.timed_out, r.oom, r.output_truncated, r.duration_s, r.layers

Each call starts a fresh sandbox (isolation.py), sends it the program, files and stdin through a payload on
its stdin (boot.py unpacks them inside), and reads stdout and stderr until it exits, the wall clock passes
`timeout_s` or an output passes `max_output_bytes`; in the last two cases it kills the whole sandbox. It
always leaves no process and no work dir behind, whatever the program did.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass

from glmstack.sandbox import isolation
from glmstack.sandbox.limits import Limits
from glmstack.sandbox.pump import encode_payload, pump

OOM_MARKERS = ("MemoryError", "Cannot allocate memory", "std::bad_alloc", "out of memory")


@dataclass(kw_only=True)
class Result:
    """What one execution did. `exit_code` is negative (-signal) when the process was killed."""

    stdout: str
    stderr: str
    exit_code: int | None
    timed_out: bool  # the wall clock passed timeout_s and the sandbox was killed
    oom: bool  # out of memory: MemoryError/allocator failure at the address-space limit, or killed because its
    #            processes together held more than memory_mb resident (needs the sandbox uid)
    output_truncated: bool  # stdout or stderr passed max_output_bytes and the sandbox was killed
    duration_s: float
    mode: str  # bwrap | unshare | plain
    layers: tuple[str, ...]  # isolation layers that applied (see docs/sandbox.md)
    uid: int | None = None  # the unprivileged uid it ran as (None: the caller's); no process of it is left
    work_dir: str | None = None  # the host work dir, already removed (None: a tmpfs inside the bwrap sandbox)

    @property
    def ok(self) -> bool:
        """Exited 0 on its own, within every limit."""
        return self.exit_code == 0 and not (self.timed_out or self.oom or self.output_truncated)

    def flags(self) -> str:
        names = [n for n in ("timed_out", "oom", "output_truncated") if getattr(self, n)]
        return ",".join(names) or "-"


def make_result(out: bytes, err: bytes, why: str, exit_code: int | None, **fields) -> Result:
    """A Result from pump's output and stop reason; `fields` are duration_s, mode, layers, uid, work_dir."""
    stdout, stderr = out.decode(errors="replace"), err.decode(errors="replace")
    oom = why == "memory" or (why == "exit" and any(m in stderr[-4096:] for m in OOM_MARKERS))
    return Result(
        stdout=stdout,
        stderr=stderr,
        exit_code=exit_code,
        timed_out=why == "timeout",
        oom=oom,
        output_truncated=why == "output",
        **fields,
    )


def _user_process_count() -> int:
    uid = os.getuid()
    return sum(1 for p in os.listdir("/proc") if p.isdigit() and _owner(p) == uid)


def _owner(pid: str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def _kill(proc: subprocess.Popen) -> None:
    """SIGKILL the launcher's process group; bwrap/unshare's death takes their PID namespace with it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _finish(proc, kill: bool) -> int:
    """Reap the launcher (killing it first if asked), then kill what is left of its process group."""
    if kill:
        _kill(proc)
    code = proc.wait()
    _kill(proc)  # stragglers that stayed in the group after closing their output (plain mode)
    return code


def _waiter(proc: subprocess.Popen):
    """pump's `wait_exit(timeout)`: whether the launcher has exited, waiting up to `timeout` for it."""

    def wait_exit(timeout: float) -> bool:
        try:
            return proc.wait(timeout=timeout) is not None if timeout > 0 else proc.poll() is not None
        except subprocess.TimeoutExpired:
            return False

    return wait_exit


def _spawn(launch: isolation.Launch) -> tuple[subprocess.Popen, tuple[int, int, int]]:
    """Start the launcher on three fresh pipes; returns it and our ends (stdin to write, stdout, stderr)."""
    (r_in, w_in), (r_out, w_out), (r_err, w_err) = os.pipe(), os.pipe(), os.pipe()
    try:
        proc = subprocess.Popen(
            launch.argv, cwd=launch.cwd, env=launch.env, stdin=r_in, stdout=w_out, stderr=w_err,
            start_new_session=True, pass_fds=launch.pass_fds,
        )  # fmt: skip
        launch.started()
    except BaseException:
        for fd in (w_in, r_out, r_err):
            os.close(fd)
        raise
    finally:
        for fd in (r_in, w_out, w_err):
            os.close(fd)
    return proc, (w_in, r_out, r_err)


def run(
    code: str,
    *,
    stdin: str | bytes | None = None,
    files: dict[str, str | bytes] | None = None,
    argv: tuple[str, ...] = (),
    limits: Limits | None = None,
    mode: str = "auto",
    site: bool = False,
    extra_ro: tuple[str, ...] = (),
    timeout_s: float | None = None,
    memory_mb: int | None = None,
    max_output_bytes: int | None = None,
    max_processes: int | None = None,
) -> Result:
    """Run `code` as `python main.py *argv` in a fresh sandbox; keywords override fields of `limits`.

    `files` (relative path -> content) are written into the empty work dir first; `site=True` adds the base
    interpreter's site-packages; `extra_ro` are host paths bound read-only (bwrap) for the program to read.
    """
    limits = (limits or Limits()).replace(
        timeout_s=timeout_s, memory_mb=memory_mb, max_output_bytes=max_output_bytes, max_processes=max_processes
    )
    mode = isolation.resolve(mode)
    launch = isolation.prepare(mode, limits.work_dir_mb, site=site, extra_ro=tuple(extra_ro))
    # Without our own uid, RLIMIT_NPROC counts every process of the caller's user: allow those plus ours.
    nproc = None if launch.uid is not None or os.geteuid() == 0 else _user_process_count() + limits.max_processes
    deathsig = mode != "bwrap" and bool(isolation.deathsig_argv())
    payload = encode_payload(code, stdin, files, argv, limits.rlimits(nproc), launch.uid, deathsig)
    start = time.monotonic()
    try:
        proc, fds = _spawn(launch)
        out, err, why = b"", b"", "interrupted"
        try:
            out, err, why = pump(fds, payload, limits, launch.uid, _waiter(proc))
        finally:  # also on KeyboardInterrupt: nothing may outlive this call
            exit_code = _finish(proc, kill=why != "exit" or proc.poll() is None)
    finally:
        launch.cleanup()
    if mode == "bwrap" and exit_code is not None and 128 < exit_code < 128 + 65:
        exit_code = 128 - exit_code  # bwrap reports a program killed by signal N as 128 + N; we say -N everywhere
    duration = time.monotonic() - start
    return make_result(
        out,
        err,
        why,
        exit_code,
        duration_s=duration,
        mode=mode,
        layers=launch.layers,
        uid=launch.uid,
        work_dir=launch.host_dir,
    )
