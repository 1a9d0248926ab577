"""The first code that runs inside the sandbox: build its file view, drop privileges, set limits, run the program.

This file is never imported by glmstack; `isolation.py` passes its text to `python -I -S -c`, so it may use
only the standard library, and it runs before any untrusted code, as the last trusted step:

1. read the payload (settings, program, files and stdin, `marshal`led by the parent, on fd 0: marshal needs
   no import, where json + base64 would add ~15 ms to every execution);
2. as root, mount what the launcher could not: in `unshare` mode the whole file view (a read-only root holding
   only the system dirs and the interpreter, a private /proc and /dev, then pivot_root), in every root mode the
   writable dirs as tmpfs limited in size *and* inodes; in `unshare` mode it then forks, staying behind as the
   PID namespace's init, so the program is not pid 1;
3. join the run's memory cgroup (through a `cgroup.procs` fd the parent opened; a warm box's fork starts in
   the box's), give the work dir to the sandbox uid and switch to that uid for good (RLIMIT_NPROC is only enforced for non-root users), re-arm the
   parent-death signal that the switch clears;
4. join a fresh session keyring (nothing of the runner's keys), set no_new_privs, install the seccomp filter;
5. lower the rlimits (soft == hard), write the input files, put the program's stdin on fd 0 (a memfd);
6. run the program as `__main__` with `sys.argv = ["main.py", *argv]`. For the verifier (verifier.py) it then
   serves calls: the grader, in its own process, sends a function name and plain arguments over a pipe and
   reads back the plain return value (`_serve_calls`); the tests and the verdict never enter this process.
"""

import marshal
import os
import resource
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
MNT_DETACH, CLONE_NEWNS, CLONE_NEWIPC = 2, 0x20000, 0x8000000
PR_SET_PDEATHSIG, PR_SET_SECCOMP, PR_SET_NO_NEW_PRIVS = 1, 22, 38
KEYCTL_JOIN_SESSION_KEYRING, SECCOMP_MODE_FILTER = 1, 2
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
# Modules a program under the verifier has no use for: raw memory access (the verdict does not depend on it:
# nothing secret is in this process; this only narrows what a program can reach).
MODULES_DENIED = frozenset({"ctypes", "_ctypes", "_testcapi", "_testinternalcapi", "_testbuffer", "cffi",
                            "_cffi_backend"})  # fmt: skip
_SOURCE = ""  # the program's text, for tracebacks
_CODECS = {}  # plain.py's text -> its namespace (a warm box's zygote loads it once for all its forks)


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


class _Native:
    """The few system calls the standard library lacks (mount, pivot_root, prctl, keyctl), through `_ctypes`
    directly: `import ctypes` costs ~10 ms per cold start, its C core under 1 ms."""

    def __init__(self, numbers):
        import _ctypes

        simple = lambda code: type("C", (_ctypes._SimpleCData,), {"_type_": code})
        self._ct, self.ulong, self.nr, self.char = _ctypes, simple("L"), numbers, simple("c")
        fn_type = type("Fn", (_ctypes.CFuncPtr,), {"_flags_": _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO,
                                                   "_restype_": simple("l")})  # fmt: skip
        libc = type("Lib", (), {"_handle": _ctypes.dlopen(None, 0)})()
        self.fn = lambda name: fn_type((name, libc))

    def _check(self, ret, what):
        if ret == -1:
            err = self._ct.get_errno()
            raise OSError(err, f"sandbox boot: {what}: {os.strerror(err)}")

    def mount(self, source, target, fstype=None, flags=0, data=None):
        enc = lambda s: None if s is None else s.encode()
        self._check(
            self.fn("mount")(enc(source), enc(target), enc(fstype), self.ulong(flags), enc(data)), f"mount {target}"
        )

    def umount_detach(self, target):
        self.fn("umount2")(target.encode(), MNT_DETACH)

    def prctl(self, option, arg, ptr=None):
        ulong = self.ulong  # prctl reads unsigned longs, and some options insist the unused ones are 0
        args = (ulong(option), ulong(arg), ptr if ptr is not None else ulong(0), ulong(0), ulong(0))
        self._check(self.fn("prctl")(*args), f"prctl {option}")

    def syscall(self, name, *args):
        self._check(self.fn("syscall")(self.nr[name], *args), name)

    def seccomp(self, prog):
        import struct

        buf = type("Buf", (self._ct.Array,), {"_type_": self.char, "_length_": len(prog)}).from_buffer_copy(prog)
        fprog = struct.pack("HxxxxxxQ", len(prog) // 8, self._ct.addressof(buf))  # struct sock_fprog
        self.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, fprog)


# ---------------------------------------------------------------- file view (as root, before the uid switch)
def _mount_scratch(n, root, scratch):
    """The writable dirs: tmpfs limited in size and inodes (an inode flood cannot eat kernel memory), or binds."""
    for kind, path, arg in scratch:
        if kind == "tmpfs":
            n.mount("tmpfs", root + path, "tmpfs", MS_NOSUID | MS_NODEV, arg)
        else:  # "bind": the same tmpfs at a second place (warm boxes' /tmp)
            n.mount(root + arg, root + path, None, MS_BIND)


def _ensure(path, is_dir):
    if is_dir:
        os.makedirs(path, 0o755, exist_ok=True)
    elif not os.path.exists(path):
        os.makedirs(os.path.dirname(path), 0o755, exist_ok=True)
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))


def _bind_ro(n, src, dst):
    n.mount(src, dst, None, MS_BIND | MS_REC)
    n.mount(None, dst, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _build_root(n, view, scratch, new="/sys"):
    """unshare mode: the file view bwrap gives, in our private mount namespace. The new root is staged on /sys
    (always there, never a bind source), then becomes / by pivot_root; the host's root is detached."""
    os.umask(0o022)
    n.mount(None, "/", None, MS_REC | MS_PRIVATE)
    n.mount("tmpfs", new, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m,nr_inodes=4096")
    for op, *args in view:
        if op == "dir":
            _ensure(new + args[0], True)
        elif op == "symlink":
            os.symlink(args[0], new + args[1])
        elif os.path.exists(args[0]) or op == "ro-bind":  # "ro-bind-try" skips what the host lacks
            _ensure(new + args[1], os.path.isdir(args[0]))
            _bind_ro(n, args[0], new + args[1])
    _ensure(new + "/proc", True)
    n.mount("proc", new + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)  # this PID namespace's processes only
    for sub in ("sys", "sysrq-trigger", "irq", "bus"):
        if os.path.exists(f"{new}/proc/{sub}"):
            _bind_ro(n, f"{new}/proc/{sub}", f"{new}/proc/{sub}")
    _ensure(new + "/dev", True)
    n.mount("tmpfs", new + "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755,size=64k,nr_inodes=64")
    for dev in DEVICES:
        _ensure(f"{new}/dev/{dev}", False)
        n.mount(f"/dev/{dev}", f"{new}/dev/{dev}", None, MS_BIND)
    for i, name in enumerate(("stdin", "stdout", "stderr")):
        os.symlink(f"/proc/self/fd/{i}", f"{new}/dev/{name}")
    os.symlink("/proc/self/fd", f"{new}/dev/fd")
    for _, path, _ in scratch:
        _ensure(new + path, True)
    _mount_scratch(n, new, scratch)
    os.chdir(new)
    os.mkdir(".old")
    n.syscall("pivot_root", b".", b".old")
    os.chdir("/")
    n.umount_detach("/.old")
    os.rmdir("/.old")
    n.mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _become_init():
    """In a new PID namespace we are pid 1, which ignores signals it has no handler for (a program killing
    itself would live on). Fork: the child runs the program; we reap orphans and exit with its status
    (128 + N for death by signal N, as bwrap's init does), which ends the namespace and all left in it."""
    pid = os.fork()
    if pid == 0:
        return
    os.closerange(0, 1 << 16)  # the program's pipes, the cgroup and call fds: the init holds none of them
    while True:
        got, status = os.waitpid(-1, 0)
        if got == pid:
            code = os.waitstatus_to_exitcode(status)
            os._exit(128 - code if code < 0 else code)


# ---------------------------------------------------------------- privileges
def _drop_privileges(uid):
    # os.setuid from root to a non-root uid clears every capability; setgroups first or we keep root's groups.
    os.chown(".", uid, uid)
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)


def _confine(n, p):
    """Everything after which no privilege is left: memory cgroup, uid, death signal, keyring, seccomp."""
    if p["cgroup_fd"] is not None:  # from here on every byte we and our children use counts against memory_mb
        os.write(p["cgroup_fd"], b"0")
        os.close(p["cgroup_fd"])
    if p["oom_first"]:  # a warm box's fork shares the box's cgroup with the zygote: be the OOM killer's pick
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    if p["uid"] is not None and os.getuid() == 0:
        _drop_privileges(p["uid"])  # also makes us non-dumpable: no other process may read our memory
        if p["deathsig"]:  # the kernel clears the parent-death signal on a uid change
            n.prctl(PR_SET_PDEATHSIG, 9)
    if p["keyring"]:  # an anonymous session keyring of our own: the runner's keys are not reachable
        n.syscall("keyctl", KEYCTL_JOIN_SESSION_KEYRING, None)
    n.prctl(PR_SET_NO_NEW_PRIVS, 1)
    if p["seccomp"] is not None:
        n.seccomp(p["seccomp"])


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


# ---------------------------------------------------------------- the verifier's callee
def _forget_ctypes():
    """Drop (_)ctypes from the module cache (the set-up above used it): a fresh import then goes through the
    audit hook. Its types stay reachable through object.__subclasses__(), which is why nothing the verdict
    depends on may live in this process."""
    for name in [m for m in sys.modules if m == "ctypes" or m.startswith(("ctypes.", "_ctypes"))]:
        del sys.modules[name]


def _audit_hook(event, args, _modules=MODULES_DENIED, _type=type, _str=str, _bytes=bytes, _err=PermissionError):
    """Defaults bind every name, so patching builtins changes nothing here."""
    if event.startswith("ctypes."):
        raise _err(f"sandbox: {event} is not available to programs under the verifier")
    if event == "import" and _type(args[0]) is _str and args[0].partition(".")[0] in _modules:
        raise _err(f"sandbox: importing {args[0]} is not available to programs under the verifier")
    if event == "open" and _type(args[0]) in (_str, _bytes):  # any process's memory, also relative to a dir fd
        sep = "/" if _type(args[0]) is _str else b"/"
        if args[0].rstrip(sep).rpartition(sep)[2] in ("mem", b"mem"):
            raise _err("sandbox: opening a process's memory is not available to programs under the verifier")


def _load_codec(source):
    ns = _CODECS.get(source)
    if ns is None:
        ns = _CODECS[source] = {"__name__": "sandbox_plain"}
        exec(source, ns)  # noqa: S102 -- glmstack/sandbox/plain.py, our own encoder
    return ns


def _read_exact(fd, n):
    buf = b""
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def _serve_calls(g, req_fd, rep_fd, codec):
    """After the program ran: answer the grader's calls until it closes the request pipe, then exit at once.
    Every reply is data the grader parses (calls.py); nothing here decides anything."""
    encode, struct = codec["encode"], __import__("struct")

    def send(kind, text):
        body = kind + text.encode("ascii", "replace")
        data = memoryview(struct.pack(">I", len(body)) + body)
        while data:
            data = data[os.write(rep_fd, data) :]

    def describe(e):
        try:
            return str(str(e))[:500]
        except BaseException as err:  # noqa: BLE001 -- the program's objects may raise anything here
            return f"<{type(err).__name__} while describing the value>"

    send(b"R", "")
    while True:
        head = _read_exact(req_fd, 4)
        if head is None:  # the grader is done: no atexit handlers, no thread joins
            try:
                sys.stdout.flush()
            finally:
                os._exit(0)
        name, args, kwargs = marshal.loads(_read_exact(req_fd, struct.unpack(">I", head)[0]))
        fn = g.get(name)
        if not callable(fn):
            send(b"M", "")
            continue
        try:
            value = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 -- reported to the tests as the exception's type name
            send(b"E", encode([type(e).__name__, describe(e)]))
            continue
        try:
            text = encode(value)
        except BaseException as e:  # noqa: BLE001 -- NotPlain, or the value's own code raising
            text = None
            send(b"N", encode(describe(e)))
        if text is not None:
            send(b"V", text)


# ---------------------------------------------------------------- main
def _prepare():
    """Everything up to the program; returns the call that runs it (never bound to a name in _main)."""
    global _SOURCE
    p = _read_payload()
    n = _Native(p["nr"])
    if p["root"] is not None:  # unshare mode: we are pid 1 of fresh namespaces, as root
        _build_root(n, p["root"], p["scratch"])
        _become_init()
    elif p["scratch"] is not None:
        if p["new_mount_ns"]:  # a warm box's fork: its own mounts and SysV IPC, gone with its last process
            n.syscall("unshare", CLONE_NEWNS | CLONE_NEWIPC)
            n.mount(None, "/", None, MS_REC | MS_PRIVATE)
        _mount_scratch(n, "", p["scratch"])
    if p["scratch"] is not None:
        os.chdir(p["scratch"][0][1])
    _confine(n, p)
    del n
    _set_limits(p["rlimits"])
    _write_files(p["files"])
    _install_stdin(p["stdin"])
    _SOURCE = p["code"]
    sys.argv = ["main.py", *p["argv"]]
    sys.path.insert(0, os.getcwd())
    import builtins  # `python -S` skips site, which defines exit() and quit(); programs call them
    from _functools import partial

    builtins.exit = builtins.quit = sys.exit
    main = type(sys)("__main__")  # a fresh module, so pickle and `if __name__ == "__main__"` behave as usual
    main.__file__ = "main.py"
    sys.modules["__main__"] = main
    code = compile(_SOURCE, "main.py", "exec")
    _forget_ctypes()
    if p["callee"] is None:
        return partial(exec, code, main.__dict__)
    (req_fd, rep_fd), codec = p["callee"], _load_codec(p["codec"])
    sys.addaudithook(_audit_hook)
    return lambda: (exec(code, main.__dict__), _serve_calls(main.__dict__, req_fd, rep_fd, codec))  # noqa: S102


def _main():
    try:
        _prepare()()  # runs the program (and, for the verifier, serves calls)
    except SystemExit:
        raise
    except BaseException as e:  # noqa: BLE001 -- print the traceback from the program's frames on, without this file's
        import linecache
        import traceback

        linecache.cache["main.py"] = (len(_SOURCE), None, _SOURCE.splitlines(True), "main.py")
        traceback.print_exception(type(e), e, e.__traceback__.tb_next)
        sys.exit(1)


if __name__ == "__main__":  # zygote.py loads this file for its functions and calls _main() per fork
    _main()
