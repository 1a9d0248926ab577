"""How many CPU threads each speedrun stage trains on: the cores nothing else is using, at most 4.

Why per stage and measured: on a quiet 2-core machine two threads run the 20-minute model's training steps 1.4x
(context 128) to 1.7x (context 512) faster than one (docs/speedrun.md), but OpenMP threads spin, and on a core another
job holds a second thread made each step about ten times slower. So before every stage the runner looks at what the
other processes are using right now (Linux: /proc/stat over half a second while this process sleeps between stages)
and takes the rest; a job started mid-run costs at most one stage at the wrong count. Elsewhere (no /proc/stat) it
keeps half the cores. `OMP_NUM_THREADS` overrides all of this (the tests set 1). The figures do not depend on the
count: the model's forward and backward are bitwise equal on 1 and 2 threads, and a whole speedrun's card on 1 and
on 1-2 threads is the same (docs/speedrun.md).

    threads = set_threads()      # before a stage; the stage's DONE.json records it
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


def set_threads() -> int:
    """Set torch's intra-op threads for the next stage (what `OMP_NUM_THREADS` says when it is set)."""
    import torch

    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(pick_threads(os.cpu_count() or 2, busy_cores()))
    return torch.get_num_threads()
