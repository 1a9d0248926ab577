"""A pre-started interpreter inside one long-lived bwrap sandbox that forks a fresh process per execution.

Like boot.py this file is not imported by glmstack: warm.py runs its text as
`python -I -S -c ZYGOTE CTL_FD BOOT CG_FD CODEC` (CODEC: plain.py, the verifier's encoder, compiled once here)
inside bwrap (as root in the sandbox, holding only CAP_SETUID/SETGID/CHOWN/SYS_ADMIN). Why: starting bwrap and
an interpreter costs tens of ms per execution; a fork costs about one. The loop, per request on the control
socket (a byte, with the execution's stdin/stdout/stderr pipe ends and its extra fds attached):

1. fork; the child starts a session, takes the received fds as fds 0, 1, 2, 3, ... and closes everything else,
   then runs boot.py's `_main()`: it reads the payload itself (so the zygote never holds one execution's program
   or data for a later fork to find), enters a mount namespace of its own with fresh size- and inode-limited
   tmpfs at /sandbox, /tmp and /dev/shm (gone with its last process: nothing to clean up, whatever the program
   left), raises its OOM score (we sit in the same memory cgroup: the OOM killer must pick it), switches to the sandbox uid, sets rlimits and runs the program; then it
   shuts down like an interpreter (threads joined, atexit run, streams flushed) and `_exit`s;
2. the zygote waits for the child and answers with the exit code (negative = signal). The parent then kills
   every process of the uid (on a timeout it does so first), so nothing of this execution runs when the next
   request comes.
"""

import fcntl
import os
import socket
import struct
import sys


def _exit_code(e):
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code & 0xFF
    print(e.code, file=sys.stderr)
    return 1


def _shutdown_like_python(code):
    try:
        threading = sys.modules.get("threading")
        if threading is not None:
            threading._shutdown()  # join non-daemon threads, as the interpreter does at exit
        import atexit

        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
    except BaseException:  # noqa: BLE001, S110 -- the program is over whatever its exit handlers do
        pass
    os._exit(code)


def _child(boot, fds, ctl):
    os.setsid()
    ctl.close()
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 256) for fd in fds]  # out of the way of the targets 0..n-1
    for target, fd in enumerate(high):
        os.dup2(fd, target)
    os.closerange(len(fds), 1 << 16)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 -- fresh text streams over the execution's pipes
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
    code = 0
    try:
        boot["_main"]()
    except SystemExit as e:
        code = _exit_code(e)
    _shutdown_like_python(code)


def _serve(ctl, boot):
    while True:
        msg, fds, _, _ = socket.recv_fds(ctl, 16, 8)
        if not msg:
            return  # the parent closed the socket: we are done
        pid = os.fork()
        if pid == 0:
            try:
                _child(boot, fds, ctl)
            finally:
                os._exit(1)
        for fd in fds:
            os.close(fd)
        _, status = os.waitpid(pid, 0)
        ctl.sendall(struct.pack("i", os.waitstatus_to_exitcode(status)))


def _main():
    if int(sys.argv[3]) >= 0:  # the box's memory cgroup: our forks start in it (see warm.py)
        os.write(int(sys.argv[3]), b"0")
        os.close(int(sys.argv[3]))
    ctl = socket.socket(fileno=int(sys.argv[1]))
    boot = {"__name__": "sandbox_boot", "__builtins__": __builtins__}
    exec(compile(sys.argv[2], "boot.py", "exec"), boot)  # noqa: S102 -- our own boot.py, for its functions
    __import__("_ctypes")  # each fork's boot uses it; imported once here, bound to no name a program could reach
    boot["_load_codec"](sys.argv[4])  # compiling it costs ~1 ms: once here, not in every fork
    os.chdir("/sandbox")
    _serve(ctl, boot)


_main()
