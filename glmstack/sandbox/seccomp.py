"""A seccomp-BPF filter, installed by boot.py in every mode just before the program runs: deny the system calls a
Python program never needs and a sandbox escape often does.

Why: namespaces and a read-only root leave the whole kernel reachable. The usual ways past them go through
user namespaces (a sandbox uid could otherwise `unshare(CLONE_NEWUSER)` and gain capabilities over new mounts),
new-mount-API and mount calls, io_uring, bpf, perf events, userfaultfd, keyrings, ptrace and module loading.
This deny list (EPERM) covers those; `clone` is allowed unless asked for a new namespace, and `clone3` answers
ENOSYS, whose flags live in memory a filter cannot read, so libc falls back to `clone`. Other architectures'
calls (i386 via int 0x80, x32) are killed, as their numbers differ. x86_64 and aarch64 only; elsewhere no
filter is applied (and the `seccomp` layer is not reported).

The program is hand-assembled classic BPF (struct sock_filter: u16 code, u8 jt, u8 jf, u32 k) over
struct seccomp_data (int nr at 0, u32 arch at 4, u64 args[6] from 16).
"""

from __future__ import annotations

import errno
import functools
import platform
import struct

ARCHES = {  # machine -> (AUDIT_ARCH_*, {name: number})
    "x86_64": (0xC000003E, {
        "unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161,
        "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "kexec_load": 246,
        "kexec_file_load": 320, "init_module": 175, "finit_module": 313, "delete_module": 176, "bpf": 321,
        "perf_event_open": 298, "userfaultfd": 323, "keyctl": 250, "add_key": 248, "request_key": 249,
        "open_by_handle_at": 304, "name_to_handle_at": 303, "swapon": 167, "swapoff": 168, "reboot": 169,
        "acct": 163, "syslog": 103, "lookup_dcookie": 212, "clone": 56, "clone3": 435,
    }),
    "aarch64": (0xC00000B7, {
        "unshare": 97, "setns": 268, "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51,
        "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "kexec_load": 104,
        "kexec_file_load": 294, "init_module": 105, "finit_module": 273, "delete_module": 106, "bpf": 280,
        "perf_event_open": 241, "userfaultfd": 282, "keyctl": 219, "add_key": 217, "request_key": 218,
        "open_by_handle_at": 265, "name_to_handle_at": 264, "swapon": 224, "swapoff": 225, "reboot": 142,
        "acct": 89, "syslog": 116, "lookup_dcookie": 18, "clone": 220, "clone3": 435,
    }),
}  # fmt: skip
# Numbers shared by every architecture since Linux 5.1 (asm-generic): io_uring and the new mount API.
COMMON = {"io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428,
          "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442}  # fmt: skip
NEW_NAMESPACE = 0x7E020080  # CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET|NEWTIME

LD_W_ABS, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06
ALLOW, KILL_PROCESS = 0x7FFF0000, 0x80000000
DENY, NOSYS = 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS


def _assemble(arch: int, numbers: dict[str, int]) -> bytes:
    denied = sorted({n for name, n in numbers.items() if name not in ("clone", "clone3")} | set(COMMON.values()))
    # Layout: 0 ld arch | 1 jeq arch | 2 kill | 3 ld nr | 4 jge x32 -> deny | checks... | allow | deny | nosys |
    # clone: ld args[0] | jset NEW_NAMESPACE -> deny | allow
    checks = [(n, "deny") for n in denied] + [(numbers["clone3"], "nosys"), (numbers["clone"], "clone")]
    first_check = 5
    allow = first_check + len(checks)
    deny, nosys, clone = allow + 1, allow + 2, allow + 3
    target = {"deny": deny, "nosys": nosys, "clone": clone}
    prog = [(LD_W_ABS, 0, 0, 4), (JEQ, 1, 0, arch), (RET, 0, 0, KILL_PROCESS), (LD_W_ABS, 0, 0, 0),
            (JGE, deny - 5, 0, 0x40000000)]  # fmt: skip
    for i, (nr, to) in enumerate(checks):
        prog.append((JEQ, target[to] - (first_check + i) - 1, 0, nr))
    prog += [(RET, 0, 0, ALLOW), (RET, 0, 0, DENY), (RET, 0, 0, NOSYS)]
    prog += [(LD_W_ABS, 0, 0, 16), (JSET, 1, 0, NEW_NAMESPACE), (RET, 0, 0, ALLOW), (RET, 0, 0, DENY)]
    assert all(0 <= jt < 256 for _, jt, _, _ in prog), "jump too long for classic BPF"
    return b"".join(struct.pack("=HBBI", *ins) for ins in prog)


@functools.cache
def program() -> bytes | None:
    """The filter for this machine's architecture, or None where we have no syscall table."""
    arch = ARCHES.get(platform.machine())
    return _assemble(*arch) if arch else None


def numbers() -> dict[str, int]:
    """This machine's numbers of the calls boot.py makes through syscall(2) (keyctl, pivot_root, unshare), or {}."""
    arch = ARCHES.get(platform.machine())
    return {k: arch[1][k] for k in ("keyctl", "pivot_root", "unshare")} if arch else {}
