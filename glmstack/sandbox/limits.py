"""Resource limits for one sandboxed execution, and their translation to rlimits.

Every limit is enforced in the child by `boot.py` (soft == hard, so the program cannot raise it back) except
the wall clock and the output size, which the parent enforces by killing the whole sandbox. Defaults suit
HumanEval-style checks: a few seconds, half a GiB, a few dozen processes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(kw_only=True, frozen=True)
class Limits:
    """What one execution may use; `run(..., timeout_s=...)` style keywords override single fields."""

    timeout_s: float = 10.0  # wall clock; the parent kills every process of the sandbox when it passes
    cpu_s: int | None = None  # RLIMIT_CPU (per process); None = int(timeout_s) + 2
    memory_mb: int = 1024  # RLIMIT_AS per process (a huge allocation fails with MemoryError) and, with
    # the sandbox uid, the resident total of all its processes (a watchdog kills it past that: oom=True)
    max_output_bytes: int = 1 << 20  # stdout and stderr each; past it the sandbox is killed, output_truncated=True
    max_processes: int = 32  # RLIMIT_NPROC for the sandbox uid (threads count too): contains fork bombs
    max_open_files: int = 64  # RLIMIT_NOFILE
    max_file_mb: int = 16  # RLIMIT_FSIZE: largest file the program may write
    work_dir_mb: int = 64  # size of the work dir's tmpfs (and of /dev/shm's) in bwrap and unshare mode
    max_files: int = 10_000  # inodes (files + dirs) of each of those tmpfs, as root: bounds an inode flood

    def replace(self, **changes) -> Limits:
        """A copy with `changes` applied; None values are ignored, so callers can pass optional keywords."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

    def rlimits(self, nproc: int | None = None) -> dict[str, int]:
        """`resource.RLIMIT_*` name -> value for boot.py; `nproc` overrides the process limit (see isolation)."""
        mib = 1 << 20
        cpu = self.cpu_s if self.cpu_s is not None else int(self.timeout_s) + 2
        return {
            "RLIMIT_CPU": cpu,
            "RLIMIT_AS": self.memory_mb * mib,
            "RLIMIT_NPROC": nproc if nproc is not None else self.max_processes,
            "RLIMIT_NOFILE": self.max_open_files,
            "RLIMIT_FSIZE": self.max_file_mb * mib,
            "RLIMIT_CORE": 0,
        }
