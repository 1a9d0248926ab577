"""The parent's side of one execution's pipes: send the payload, collect output, enforce the limits.

Shared by the cold path (run.py: a fresh bwrap per execution) and the warm path (warm.py: a fork from a
pre-started interpreter). Both hand `pump` three raw pipe fds and a `wait_exit(timeout) -> bool` that says
whether the program's main process has ended; `pump` returns why it stopped, and the caller kills and reaps.
"""

from __future__ import annotations

import marshal
import os
import selectors
import threading
import time
from collections.abc import Callable

from glmstack.sandbox import uids
from glmstack.sandbox.limits import Limits

EXIT_GRACE_S = 0.2  # after the main process exits, read this long more for output still in the pipes
WATCH_S = 0.05  # how often the sandbox's total resident memory is checked (when it has its own uid)


def _as_bytes(data: str | bytes | None) -> bytes:
    if data is None:
        return b""
    return data.encode() if isinstance(data, str) else data


def encode_payload(code: str, stdin, files, argv, settings: dict) -> bytes:
    """What boot.py reads on fd 0: a decimal length line, then a marshalled dict (marshal needs no import in
    the sandbox, and format 4 is read by every Python 3 we may run there). `settings`: isolation.boot_settings."""
    body = marshal.dumps(
        {
            **settings,
            "code": code,
            "argv": list(argv),
            "stdin": _as_bytes(stdin),
            "files": {str(name): _as_bytes(data) for name, data in (files or {}).items()},
        },
        4,
    )
    return b"%d\n" % len(body) + body


def _send(fd: int, payload: bytes, sent: int) -> int:
    """Write the next piece of the payload; returns the new count sent (all of it once the pipe broke)."""
    try:
        return sent + os.write(fd, payload[sent : sent + (1 << 16)])
    except BlockingIOError:
        return sent
    except BrokenPipeError:  # the sandbox died before reading it all; its output says why
        return len(payload)


def memory_check(uid: int | None, cgroup, limits: Limits) -> Callable[[], bool] | None:
    """What pump polls every WATCH_S: the memory cgroup's OOM counter (all memory counted, the kernel enforces
    the limit), else the resident-set watchdog over the sandbox uid's processes, else nothing (not root)."""
    if cgroup is not None:
        return cgroup.oom_killed
    if uid is not None:
        return lambda: uids.resident_bytes(uid) > limits.memory_mb << 20
    return None


def pump(
    fds: tuple[int, int, int],
    payload: bytes,
    limits: Limits,
    over_memory: Callable[[], bool] | None,
    wait_exit: Callable[[float], bool],
) -> tuple[bytes, bytes, str]:
    """Feed `payload` into fds[0] and read fds[1], fds[2] until the program ends or breaks a limit; closes all
    three. Returns (stdout, stderr, why): why is "exit", "timeout", "output" (an output passed its limit) or
    "memory" (`over_memory()`, see memory_check, said so; checked every WATCH_S).
    """
    stdin_fd, out_fd, err_fd = fds
    deadline = time.monotonic() + limits.timeout_s
    bufs = {out_fd: bytearray(), err_fd: bytearray()}
    sel = selectors.DefaultSelector()
    os.set_blocking(stdin_fd, False)
    sel.register(stdin_fd, selectors.EVENT_WRITE)
    for fd in bufs:
        sel.register(fd, selectors.EVENT_READ)
    sent, open_outputs, exited_at, why, next_watch = 0, 2, None, "exit", 0.0
    try:
        while True:
            now = time.monotonic()
            if now >= deadline:
                why = "timeout"
                break
            if now >= next_watch:
                next_watch = now + WATCH_S
                if over_memory is not None and over_memory():
                    why = "memory"
                    break
            if exited_at is None and wait_exit(0):
                exited_at = now
            # Done once the program exited and its output is read; a daemon that escaped the session (plain
            # mode) may hold the pipes open, so stop reading EXIT_GRACE_S after the exit in any case.
            if exited_at is not None and (not open_outputs or now - exited_at > EXIT_GRACE_S):
                break
            if not sel.get_map():  # outputs closed but the program lives on: keep watching it
                wait_exit(min(deadline - now, WATCH_S))
                continue
            for key, _ in sel.select(min(deadline - now, WATCH_S)):
                if key.fd == stdin_fd:
                    sent = _send(stdin_fd, payload, sent)
                    if sent >= len(payload):
                        sel.unregister(stdin_fd)
                        os.close(stdin_fd)
                        stdin_fd = -1
                    continue
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    sel.unregister(key.fd)
                    open_outputs -= 1
                    continue
                bufs[key.fd] += chunk
                if len(bufs[key.fd]) > limits.max_output_bytes:
                    del bufs[key.fd][limits.max_output_bytes :]
                    why = "output"
                    open_outputs = 0
                    break
            if why == "output":
                break
        return bytes(bufs[out_fd]), bytes(bufs[err_fd]), why
    finally:
        sel.close()
        for fd in (stdin_fd, out_fd, err_fd):
            if fd >= 0:
                os.close(fd)


def pump_while(driver, pipe, kill: Callable[[], None], *pump_args) -> tuple[bytes, bytes, str]:
    """`pump(*pump_args)`, and with a `driver` (verifier.py) pump in a thread while `driver(pipe)` calls the program
    from this one. When the driver is done the pipe closes (the program then exits at once); a program still
    there EXIT_GRACE_S later is killed, so it cannot hold the grader beyond its last call."""
    if driver is None:
        return pump(*pump_args)
    box: dict = {}

    def work() -> None:
        try:
            box["out"] = pump(*pump_args)
        except BaseException as e:  # noqa: BLE001 -- re-raised in the caller's thread
            box["error"] = e

    thread = threading.Thread(target=work, name="sandbox-pump", daemon=True)
    thread.start()
    try:
        driver(pipe)
    finally:
        pipe.close()
        thread.join(EXIT_GRACE_S)
        if thread.is_alive():
            kill()
            thread.join()
    if "error" in box:
        raise box["error"]
    return box["out"]
