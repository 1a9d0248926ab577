"""Many sandboxed executions at once: a worker pool with a fixed concurrency.

    from glmstack.sandbox import Job, run_batch
    results = run_batch([Job(code="print(1)"), Job(code="print(2)", stdin="x")], concurrency=2)

Each execution is its own sandbox process, so the workers are threads that only start processes and wait on
pipes (the GIL is not the bottleneck). `concurrency` defaults to the number of CPUs; every execution runs at
most `timeout_s`, so a batch of n takes at most about n / concurrency * timeout_s.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from glmstack.sandbox.limits import Limits
from glmstack.sandbox.run import Result, run


@dataclass(kw_only=True)
class Job:
    """The arguments of one `run` call."""

    code: str
    stdin: str | bytes | None = None
    files: dict[str, str | bytes] = field(default_factory=dict)
    argv: tuple[str, ...] = ()
    limits: Limits | None = None  # None: the batch's limits


def default_concurrency() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def run_batch(
    jobs: Iterable[Job | str],
    *,
    concurrency: int | None = None,
    limits: Limits | None = None,
    mode: str = "auto",
    on_result: Callable[[int, Result], None] | None = None,
) -> list[Result]:
    """Run every job (a Job or a code string) with `concurrency` at once; results in the jobs' order.

    `on_result(index, result)` is called as each finishes (from a worker thread), e.g. for a progress bar.
    """
    jobs = [Job(code=j) if isinstance(j, str) else j for j in jobs]
    limits = limits or Limits()

    def one(i: int) -> Result:
        j = jobs[i]
        r = run(j.code, stdin=j.stdin, files=j.files, argv=j.argv, limits=j.limits or limits, mode=mode)
        if on_result is not None:
            on_result(i, r)
        return r

    with ThreadPoolExecutor(max_workers=concurrency or default_concurrency()) as ex:
        return list(ex.map(one, range(len(jobs))))
