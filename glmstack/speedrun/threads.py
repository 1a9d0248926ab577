"""How many CPU threads a speedrun trains on: the cores idle when it starts, at most 4, fixed for the whole run.

Why measured: on a quiet 2-core machine two threads run the 20-minute row's training steps 1.3x (pre-training,
context 128) to 1.5x (SFT, context 512) faster than one, but OpenMP threads spin, and on a core another job holds a
second thread made each step about ten times slower. So a new run looks at what the other processes use (Linux:
/proc/stat over half a second) and takes the rest; elsewhere it keeps half the cores. `OMP_NUM_THREADS` overrides
this (the tests set 1).

Why fixed and recorded: the count changes the figures. The model's forward and backward are bitwise equal on 1 and
2 threads, but a whole 20-minute run is not (seed 0's card differs, docs/speedrun.md), so the count is decided once,
written to the run's speedrun.json beside the seed, and a continued run reuses it: one seed at one count gives the
same figures on one CPU.

    threads = start_threads()    # a new run; a continued one passes the recorded count to set_threads
"""

from __future__ import annotations

import os
import time

MAX_THREADS = 4
SAMPLE_S = 0.5


def busy_cores(sample_s: float = SAMPLE_S) -> float | None:
    """Cores' worth of CPU time the whole machine used over `sample_s` seconds (None without /proc/stat)."""

    def snapshot() -> tuple[int, int] | None:
        try:
            with open("/proc/stat") as f:
                fields = [int(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return sum(fields) - idle, sum(fields)

    a = snapshot()
    if a is None:
        return None
    time.sleep(sample_s)
    b = snapshot()
    if b is None or b[1] == a[1]:
        return None
    return (b[0] - a[0]) / (b[1] - a[1]) * (os.cpu_count() or 1)


def pick_threads(cores: int, busy: float | None) -> int:
    """The idle cores (rounded), at least 1 and at most MAX_THREADS; half the cores when `busy` is unknown."""
    if busy is None:
        return max(1, min(MAX_THREADS, cores // 2))
    return max(1, min(MAX_THREADS, round(cores - busy)))


def start_threads() -> int:
    """A new run's count: OMP_NUM_THREADS when set, else the idle cores now."""
    if "OMP_NUM_THREADS" in os.environ:
        value = os.environ["OMP_NUM_THREADS"]
        if not value.strip().isdigit() or int(value) < 1:
            raise SystemExit(f"glmstack speedrun: OMP_NUM_THREADS={value!r} is not a positive whole number")
        return int(value)
    return pick_threads(os.cpu_count() or 2, busy_cores())


def set_threads(n: int) -> int:
    import torch

    torch.set_num_threads(n)
    return torch.get_num_threads()
