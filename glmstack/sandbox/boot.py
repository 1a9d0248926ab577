"""The first code that runs inside the sandbox: drop privileges, set rlimits, unpack files, run the program.

This file is never imported by glmstack; `isolation.py` passes its text to `python -I -S -c`, so it may use
only the standard library, and it runs before any untrusted code, as the last trusted step:

1. read the payload (settings, program, files and stdin, `marshal`led by the parent, on fd 0: marshal needs
   no import, where json + base64 would add ~15 ms to every execution);
2. when started as root give the work dir to the sandbox uid and switch to that uid for good (RLIMIT_NPROC is
   only enforced for non-root users, so the fork-bomb limit needs this), re-arming the parent-death signal
   that the switch clears (outside bwrap);
3. lower the rlimits (soft == hard, so the program cannot raise them back);
4. write the input files into the work dir, put the program's stdin on fd 0 (a memfd, no disk);
5. exec the program as `__main__` with `sys.argv = ["main.py", *argv]`.
"""

import marshal
import os
import resource
import sys


def _read_payload():
    head = b""
    while not head.endswith(b"\n"):
        chunk = os.read(0, 1)
        if not chunk:
            raise SystemExit("sandbox boot: truncated payload")
        head += chunk
    need, buf = int(head), []
    while need > 0:
        chunk = os.read(0, min(need, 1 << 20))
        if not chunk:
            raise SystemExit("sandbox boot: truncated payload")
        buf.append(chunk)
        need -= len(chunk)
    return marshal.loads(b"".join(buf))


def _drop_privileges(uid):
    # os.setuid from root to a non-root uid clears every capability; setgroups first or we keep root's groups.
    os.chown(".", uid, uid)
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)


def _rearm_death_signal():
    # The kernel clears the parent-death signal (setpriv/unshare --kill-child) on a uid change; set it again so
    # the sandbox still dies with its launcher outside bwrap. PR_SET_PDEATHSIG = 1.
    import ctypes
    import signal

    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)


def _set_limits(limits):
    for name, value in limits.items():
        resource.setrlimit(getattr(resource, name), (value, value))


def _write_files(files):
    for rel, data in files.items():
        path = os.path.normpath(rel)
        if os.path.isabs(path) or path.startswith(".."):
            raise SystemExit(f"sandbox boot: file path outside the work dir: {rel!r}")
        if os.path.dirname(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)


def _install_stdin(data):
    fd = os.memfd_create("stdin")
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    os.dup2(fd, 0)
    os.close(fd)
    sys.stdin = open(0, "r", closefd=False, errors="replace")  # noqa: SIM115 (open for the program's lifetime)


def _main():
    p = _read_payload()
    if p["uid"] is not None and os.getuid() == 0:
        _drop_privileges(p["uid"])
        if p["deathsig"]:
            _rearm_death_signal()
    _set_limits(p["rlimits"])
    _write_files(p["files"])
    _install_stdin(p["stdin"])
    code, argv = p["code"], p["argv"]
    del p
    sys.argv = ["main.py", *argv]
    sys.path.insert(0, os.getcwd())
    import builtins  # `python -S` skips site, which defines exit() and quit(); programs call them

    builtins.exit = builtins.quit = sys.exit
    main = type(sys)("__main__")  # a fresh module, so pickle and `if __name__ == "__main__"` behave as usual
    main.__file__ = "main.py"
    sys.modules["__main__"] = main
    try:
        exec(compile(code, "main.py", "exec"), main.__dict__)  # noqa: S102 (running it is the point; we are sandboxed)
    except SystemExit:
        raise
    except BaseException as e:  # noqa: BLE001 -- print the traceback from the program's frames on, without this file's
        import linecache
        import traceback

        linecache.cache["main.py"] = (len(code), None, code.splitlines(True), "main.py")
        traceback.print_exception(type(e), e, e.__traceback__.tb_next)
        sys.exit(1)


if __name__ == "__main__":  # zygote.py loads this file for its functions and calls _main() per fork
    _main()
