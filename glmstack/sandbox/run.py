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

import marshal
import os
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass

from glmstack.sandbox import isolation, uids
from glmstack.sandbox.limits import Limits

EXIT_GRACE_S = 0.2  # after the launcher exits, read this long more for output still in the pipes
WATCH_S = 0.05  # how often the sandbox's total resident memory is checked (when it has its own uid)
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


def _as_bytes(data: str | bytes | None) -> bytes:
    if data is None:
        return b""
    return data.encode() if isinstance(data, str) else data


def _payload(code: str, stdin, files, argv, rlimits: dict, uid: int | None, deathsig: bool) -> bytes:
    body = marshal.dumps(
        {  # boot.py reads it; version 2+ of marshal is the same in every Python 3
            "code": code,
            "argv": list(argv),
            "uid": uid,
            "rlimits": rlimits,
            "deathsig": deathsig,
            "stdin": _as_bytes(stdin),
            "files": {str(name): _as_bytes(data) for name, data in (files or {}).items()},
        },
        4,
    )
    return b"%d\n" % len(body) + body


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


def _send(fd: int, payload: bytes, sent: int) -> int:
    """Write the next piece of the payload; returns the new count sent (all of it once the pipe broke)."""
    try:
        return sent + os.write(fd, payload[sent : sent + (1 << 16)])
    except BlockingIOError:
        return sent
    except BrokenPipeError:  # the sandbox died before reading it all; its output says why
        return len(payload)


def _pump(proc, payload: bytes, limits: Limits, uid: int | None) -> tuple[bytes, bytes, str]:
    """Feed the payload and collect output until the sandbox ends or breaks a limit.

    Returns (stdout, stderr, why): why is "exit", "timeout", "output" (an output passed its limit) or "memory"
    (the sandbox uid's processes together hold more than memory_mb resident, checked every WATCH_S).
    """
    deadline = time.monotonic() + limits.timeout_s
    out, err = bytearray(), bytearray()
    bufs = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}
    sel = selectors.DefaultSelector()
    for fd in bufs:
        sel.register(fd, selectors.EVENT_READ)
    stdin_fd = proc.stdin.fileno()
    os.set_blocking(stdin_fd, False)
    sel.register(stdin_fd, selectors.EVENT_WRITE)
    sent, open_outputs, exited_at, why, next_watch = 0, 2, None, "exit", 0.0
    try:
        while True:
            now = time.monotonic()
            if now >= deadline:
                why = "timeout"
                break
            if uid is not None and now >= next_watch:
                next_watch = now + WATCH_S
                if uids.resident_bytes(uid) > limits.memory_mb << 20:
                    why = "memory"
                    break
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            # Done once the launcher exited and its output is read; a daemon that escaped the session (plain
            # mode) may hold the pipes open, so stop reading EXIT_GRACE_S after the exit in any case.
            if exited_at is not None and (not open_outputs or now - exited_at > EXIT_GRACE_S):
                break
            if not sel.get_map():  # outputs closed but the program lives on: keep watching it
                try:
                    proc.wait(timeout=min(deadline - now, WATCH_S))
                except subprocess.TimeoutExpired:
                    pass
                continue
            for key, _ in sel.select(min(deadline - now, WATCH_S)):
                if key.fd == stdin_fd:
                    sent = _send(stdin_fd, payload, sent)
                    if sent >= len(payload):
                        sel.unregister(stdin_fd)
                        proc.stdin.close()
                    continue
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    sel.unregister(key.fd)
                    open_outputs -= 1
                    continue
                bufs[key.fd] += chunk
                if len(bufs[key.fd]) > limits.max_output_bytes:
                    del bufs[key.fd][limits.max_output_bytes :]
                    return bytes(out), bytes(err), "output"
        return bytes(out), bytes(err), why
    finally:
        sel.close()


def _finish(proc, kill: bool) -> int:
    """Reap the launcher (killing it first if asked), then kill what is left of its process group."""
    if kill:
        _kill(proc)
    code = proc.wait()
    _kill(proc)  # stragglers that stayed in the group after closing their output (plain mode)
    for f in (proc.stdin, proc.stdout, proc.stderr):
        if not f.closed:
            f.close()
    return code


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
    payload = _payload(
        code,
        stdin,
        files,
        argv,
        limits.rlimits(nproc),
        launch.uid,
        deathsig=mode != "bwrap" and bool(isolation.deathsig_argv()),
    )
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            launch.argv,
            cwd=launch.cwd,
            env=launch.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        out, err, why = b"", b"", "interrupted"
        try:
            out, err, why = _pump(proc, payload, limits, launch.uid)
        finally:  # also on KeyboardInterrupt: nothing may outlive this call
            exit_code = _finish(proc, kill=why != "exit" or proc.poll() is None)
    finally:
        launch.cleanup()
    duration = time.monotonic() - start
    stdout, stderr = out.decode(errors="replace"), err.decode(errors="replace")
    oom = why == "memory" or (why == "exit" and any(m in stderr[-4096:] for m in OOM_MARKERS))
    return Result(
        stdout=stdout,
        stderr=stderr,
        exit_code=exit_code,
        timed_out=why == "timeout",
        oom=oom,
        output_truncated=why == "output",
        duration_s=duration,
        mode=mode,
        layers=launch.layers,
        uid=launch.uid,
        work_dir=launch.host_dir,
    )
