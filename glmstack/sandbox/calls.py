"""The grader's end of the call pipe to a candidate running in the sandbox (verifier.py's transport).

Two pipes per execution, made here and handed to the sandbox like the program's stdio: requests (grader ->
candidate) and replies (candidate -> grader). Frames are a 4-byte big-endian length and a body.

    request  marshal((function name, args tuple, kwargs dict))       trusted data the grader built; boot.py unmarshals it
    reply    one kind byte + text written by the candidate, untrusted:
             b"R" ready (the program ran to its end and now serves calls)
             b"V" plain.encode(return value)     b"E" plain.encode([exception type name, message])
             b"N" why the value was not plain    b"M" no such function

The grader never unmarshals or evaluates what comes back: a reply is at most MAX_REPLY bytes, and values are
rebuilt by plain.decode. Every read waits at most until the execution's deadline; a closed pipe means the
candidate is gone (it exited, crashed or was killed), which `Gone` reports.
"""

from __future__ import annotations

import marshal
import os
import select
import struct
import time

MAX_REPLY = 8 << 20  # bytes of one reply; more is a failure (not_plain_value), never read into memory


class Gone(Exception):
    """The candidate closed its end (exited, crashed, killed) or broke the framing."""


class TimedOut(Exception):
    """No reply before the deadline."""


class ReplyTooLarge(Exception):
    pass


class CallPipe:
    """Our ends of the two pipes; `theirs` are the candidate's (read requests, write replies), to pass to the
    sandbox and close here once it started."""

    def __init__(self, deadline: float):
        (self.req_r, self.req_w), (self.rep_r, self.rep_w) = os.pipe(), os.pipe()
        self.deadline = deadline
        self._buf = bytearray()

    @property
    def theirs(self) -> tuple[int, int]:
        return self.req_r, self.rep_w

    def started(self) -> None:
        """The sandbox holds its copies now; without closing ours, a dead candidate would never read as EOF."""
        for fd in self.theirs:
            os.close(fd)
        self.req_r = self.rep_w = -1

    def close(self) -> None:
        """Close everything of ours; the candidate then reads EOF on requests and exits."""
        for name in ("req_r", "req_w", "rep_r", "rep_w"):
            fd = getattr(self, name)
            if fd >= 0:
                os.close(fd)
                setattr(self, name, -1)

    def call(self, name: str, args: tuple, kwargs: dict) -> tuple[bytes, bytes]:
        """Send one call; returns the reply's (kind, body)."""
        self._send(marshal.dumps((name, args, kwargs), 4))
        return self.reply()

    def reply(self) -> tuple[bytes, bytes]:
        body = self._read_frame()
        return body[:1], body[1:]

    def _send(self, body: bytes) -> None:
        data = struct.pack(">I", len(body)) + body
        try:
            while data:  # a candidate that stops reading requests would block us here: wait with the deadline
                if not select.select([], [self.req_w], [], self._left())[1]:
                    raise TimedOut
                data = data[os.write(self.req_w, data[: 1 << 16]) :]
        except BrokenPipeError:
            raise Gone from None

    def _left(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimedOut
        return left

    def _fill(self, need: int) -> None:
        while len(self._buf) < need:
            if not select.select([self.rep_r], [], [], self._left())[0]:
                raise TimedOut
            chunk = os.read(self.rep_r, min(need - len(self._buf), 1 << 20))
            if not chunk:
                raise Gone
            self._buf += chunk

    def _read_frame(self) -> bytes:
        self._fill(4)
        size = struct.unpack(">I", self._buf[:4])[0]
        if size == 0:
            raise Gone  # every reply has a kind byte: an empty frame is garbage
        if size > MAX_REPLY:
            raise ReplyTooLarge(f"a reply of {size} bytes (the limit is {MAX_REPLY})")
        self._fill(4 + size)
        body = bytes(self._buf[4 : 4 + size])
        del self._buf[: 4 + size]
        return body
