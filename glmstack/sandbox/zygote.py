"""A pre-started interpreter inside one long-lived bwrap sandbox that forks a fresh process per execution.

Like boot.py this file is not imported by glmstack: warm.py runs its text as `python -I -S -c ZYGOTE CTL_FD BOOT`
inside bwrap (as root in the sandbox, holding only CAP_SETUID/SETGID/CHOWN). Why: starting bwrap and an
interpreter costs tens of ms per execution; a fork costs about one. The loop, per request on the control socket
(the sandbox uid as text, with the execution's stdin/stdout/stderr pipe ends attached):

1. make an empty work dir /sandbox/<n>, fork;
2. the child starts a session, takes the three pipes as fds 0-2, closes everything else, enters the work dir
   and runs boot.py's `_main()`: it reads the payload itself (so the zygote never holds one execution's program
   or data for a later fork to find), switches to the sandbox uid, sets rlimits and runs the program; then it
   shuts down like an interpreter (threads joined, atexit run, streams flushed) and `_exit`s;
3. the zygote waits for the child, removes the work dir and answers with the exit code (negative = signal).
   The parent then kills every process of the uid (on a timeout it does so first), so when the next request
   comes nothing of this execution runs, and the zygote empties the shared /sandbox, /tmp and /dev/shm.
"""

import os
import shutil
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


def _child(boot, fds, ctl, work):
    os.setsid()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    ctl.close()
    os.closerange(3, 1 << 16)
    os.chdir(work)
    os.environ["HOME"] = os.environ["TMPDIR"] = work
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 -- fresh text streams over the execution's pipes
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
    code = 0
    try:
        boot["_main"]()
    except SystemExit as e:
        code = _exit_code(e)
    _shutdown_like_python(code)


def _clear(path):
    for name in os.listdir(path):
        p = os.path.join(path, name)
        try:
            if os.path.isdir(p) and not os.path.islink(p):
                shutil.rmtree(p)
            else:
                os.unlink(p)
        except OSError:
            pass


def _serve(ctl, boot):
    for n in range(1 << 62):
        msg, fds, _, _ = socket.recv_fds(ctl, 64, 3)
        if not msg:
            return  # the parent closed the socket: we are done
        for shared in ("/sandbox", "/tmp", "/dev/shm"):  # the parent killed the last uid: nothing can refill them
            _clear(shared)
        work = f"/sandbox/{n}"
        os.mkdir(work, 0o700)
        pid = os.fork()
        if pid == 0:
            try:
                _child(boot, fds, ctl, work)
            finally:
                os._exit(1)
        for fd in fds:
            os.close(fd)
        _, status = os.waitpid(pid, 0)
        shutil.rmtree(work, ignore_errors=True)
        ctl.sendall(struct.pack("i", os.waitstatus_to_exitcode(status)))


def _main():
    ctl = socket.socket(fileno=int(sys.argv[1]))
    boot = {"__name__": "sandbox_boot", "__builtins__": __builtins__}
    exec(compile(sys.argv[2], "boot.py", "exec"), boot)  # noqa: S102 -- our own boot.py, for its functions
    os.chmod("/sandbox", 0o755)  # only the zygote creates work dirs here
    os.chdir("/sandbox")
    _serve(ctl, boot)


_main()
