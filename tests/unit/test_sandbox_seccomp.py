"""The seccomp filter: well-formed BPF, the escape-prone calls denied in every mode, everyday Python untouched."""

import os
import platform
import struct

import pytest

from glmstack.sandbox import WarmSandbox, isolation, run, seccomp
from glmstack.sandbox.warm import warm_available

needs_filter = pytest.mark.skipif(seccomp.program() is None, reason=f"no syscall table for {platform.machine()}")

PROBE = """import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
nr = {nr}
def call(n, *args):
    r = libc.syscall(n, *args)
    return errno.errorcode.get(ctypes.get_errno(), "?") if r == -1 else "ran"
print("unshare", call(nr["unshare"], 0x10000000))
print("clone-newuser", call(nr["clone"], 0x10000000 | 17, 0, 0, 0, 0))
print("clone3", call(nr["clone3"], 0, 0))
print("mount", call(nr["mount"], b"none", b"/sandbox", b"tmpfs", 0, 0))
print("io_uring_setup", call(425, 1, 0))
print("bpf", call(nr["bpf"], 0, 0, 0))
print("userfaultfd", call(nr["userfaultfd"], 0))
print("ptrace", call(nr["ptrace"], 16, 1, 0, 0))
print("keyctl", call(nr["keyctl"], 0, -3, 0))
print("perf_event_open", call(nr["perf_event_open"], 0, 0, -1, -1, 0))
pid = os.fork()
if pid == 0:
    os._exit(0)
print("fork", os.waitpid(pid, 0)[1])
"""
EXPECTED = ("unshare EPERM\nclone-newuser EPERM\nclone3 ENOSYS\nmount EPERM\nio_uring_setup EPERM\nbpf EPERM\n"
            "userfaultfd EPERM\nptrace EPERM\nkeyctl EPERM\nperf_event_open EPERM\nfork 0\n")  # fmt: skip


@needs_filter
def test_program_is_well_formed_classic_bpf():
    prog = seccomp.program()
    assert len(prog) % 8 == 0 and len(prog) // 8 < 4096
    ins = [struct.unpack("=HBBI", prog[i : i + 8]) for i in range(0, len(prog), 8)]
    for i, (code, jt, jf, _) in enumerate(ins):
        if code & 0x07 == 0x05:  # a jump: both targets inside the program
            assert i + 1 + max(jt, jf) < len(ins)
    assert ins[-1][0] == 0x06 and ins[0] == (0x20, 0, 0, 4)  # ends in a return, starts by loading the arch


@needs_filter
@pytest.mark.parametrize("mode", ["bwrap", "warm", "unshare", "plain"])
def test_escape_prone_calls_are_denied_in_every_mode(mode, monkeypatch):
    if mode == "warm" and not warm_available():
        pytest.skip("warm sandboxes need root and bubblewrap")
    if mode != "warm" and not isolation.available(mode):
        pytest.skip(f"{mode} unavailable")
    if mode == "plain" and os.geteuid() == 0:
        monkeypatch.setenv("GLMSTACK_SANDBOX_PYTHON", "/usr/bin/python3")  # one the sandbox uid can run
    code = PROBE.format(nr=seccomp.ARCHES[platform.machine()][1])
    if mode == "warm":
        with WarmSandbox() as box:
            r = box.run(code, timeout_s=10)
    else:
        r = run(code, mode=mode, timeout_s=10)
    assert r.stdout == EXPECTED, r.stderr
    assert "seccomp" in r.layers
