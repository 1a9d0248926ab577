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
from collections.abc import Callable
from dataclasses import dataclass

from glmstack.sandbox import isolation
from glmstack.sandbox.calls import CallPipe
from glmstack.sandbox.limits import Limits
from glmstack.sandbox.pump import encode_payload, memory_check, pump_while

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
    work_dir: str | None = None  # the host work dir, already removed (None: a tmpfs inside the sandbox)

    @property
    def ok(self) -> bool:
        """Exited 0 on its own, within every limit. Says nothing about correctness: grading is verifier.py's."""
        limits_hit = self.timed_out or self.oom or self.output_truncated
        return self.exit_code == 0 and not limits_hit

    def flags(self) -> str:
        return ",".join(n for n in ("timed_out", "oom", "output_truncated") if getattr(self, n)) or "-"


def make_result(out: bytes, err: bytes, why: str, exit_code: int | None, **fields) -> Result:
    """A Result from pump's output and stop reason; `fields` are duration_s, mode, layers, uid, work_dir.
    `why` is "memory" when the watchdog or the memory cgroup stopped the run."""
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


def _spawn(launch: isolation.Launch, extra: tuple[int, ...] = ()) -> tuple[subprocess.Popen, tuple[int, int, int]]:
    """Start the launcher on three fresh pipes (and `extra` fds it inherits as they are); returns it and our ends
    (stdin to write, stdout, stderr)."""
    (r_in, w_in), (r_out, w_out), (r_err, w_err) = os.pipe(), os.pipe(), os.pipe()
    try:
        proc = subprocess.Popen(
            launch.argv, cwd=launch.cwd, env=launch.env, stdin=r_in, stdout=w_out, stderr=w_err,
            start_new_session=True, pass_fds=launch.pass_fds + tuple(extra),
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
    driver: Callable[[CallPipe], None] | None = None,
) -> Result:
    """Run `code` as `python main.py *argv` in a fresh sandbox; keywords override fields of `limits`.

    `files` (relative path -> content) are written into the empty work dir first; `site=True` adds the base
    interpreter's site-packages; `extra_ro` are host paths bound read-only for the program to read. `driver`
    (what verifier.py uses): after the program ran it serves calls, and `driver(pipe)` makes them from this
    process while the program lives; when it returns the program is ended.
    """
    limits = (limits or Limits()).replace(
        timeout_s=timeout_s, memory_mb=memory_mb, max_output_bytes=max_output_bytes, max_processes=max_processes
    )
    mode = isolation.resolve(mode)
    start = time.monotonic()
    pipe = CallPipe(start + limits.timeout_s) if driver is not None else None
    try:
        launch = isolation.prepare(mode, limits, site=site, extra_ro=tuple(extra_ro), callee=pipe and pipe.theirs)
        try:
            payload = encode_payload(code, stdin, files, argv, launch.boot)
            proc, fds = _spawn(launch, pipe.theirs if pipe else ())
            if pipe is not None:
                pipe.started()
            out, err, why = b"", b"", "interrupted"
            over_memory = memory_check(launch.uid, launch.cgroup, limits)
            try:
                args = (fds, payload, limits, over_memory, _waiter(proc))
                out, err, why = pump_while(driver, pipe, lambda: _kill(proc), *args)
            finally:  # also on KeyboardInterrupt: nothing may outlive this call
                exit_code = _finish(proc, kill=why != "exit" or proc.poll() is None)
            if why == "exit" and launch.cgroup is not None and launch.cgroup.oom_killed():
                why = "memory"
        finally:
            launch.cleanup()
    finally:
        if pipe is not None:
            pipe.close()
    if mode != "plain" and exit_code is not None and 128 < exit_code < 128 + 65:
        exit_code = 128 - exit_code  # the namespace's init reports death by signal N as 128 + N; we say -N everywhere
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
