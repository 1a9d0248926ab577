"""Many sandboxed executions at once: a worker pool with a fixed concurrency.

    from glmstack.sandbox import Job, run_batch
    results = run_batch([Job(code="print(1)"), Job(code="print(2)", stdin="x")], concurrency=2)

Each execution is its own sandbox process, so the workers are threads that only start processes and wait on
pipes (the GIL is not the bottleneck). As root with bubblewrap each worker keeps a warm sandbox (warm.py) and
forks a fresh process per execution; otherwise each execution starts a cold one (run.py). `concurrency` defaults to the number of CPUs; every execution runs at
most `timeout_s`, so a batch of n takes at most about n / concurrency * timeout_s.
"""

from __future__ import annotations

import os
import queue
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from glmstack.sandbox import isolation
from glmstack.sandbox.limits import Limits
from glmstack.sandbox.run import Result, run
from glmstack.sandbox.warm import WarmSandbox, warm_available


@dataclass(kw_only=True)
class Job:
    """The arguments of one `run` call."""

    code: str
    stdin: str | bytes | None = None
    files: dict[str, str | bytes] = field(default_factory=dict)
    argv: tuple[str, ...] = ()
    limits: Limits | None = None  # None: the batch's limits
    driver: Callable | None = None  # verifier.py's grader: calls the program from this process while it runs


def default_concurrency() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _use_warm(warm: bool | None, mode: str) -> bool:
    """None: warm boxes when available, unless env GLMSTACK_SANDBOX_WARM=0 (cold runs, e.g. to compare)."""
    if warm is None and os.environ.get("GLMSTACK_SANDBOX_WARM") == "0":
        return False
    if warm is False or mode not in ("auto", "bwrap"):
        return False
    ok = warm_available() and isolation.resolve(mode) == "bwrap"
    if warm and not ok:
        raise RuntimeError("warm=True needs bubblewrap and root (see docs/sandbox.md)")
    return ok


def run_batch(
    jobs: Iterable[Job | str],
    *,
    concurrency: int | None = None,
    limits: Limits | None = None,
    mode: str = "auto",
    warm: bool | None = None,
    on_result: Callable[[int, Result], None] | None = None,
) -> list[Result]:
    """Run every job (a Job or a code string) with `concurrency` at once; results in the jobs' order.

    `warm`: one WarmSandbox per worker (a fork per execution instead of a new bwrap, several times faster);
    None = when available (root + bwrap), False = a cold sandbox per execution. `on_result(index, result)` is
    called as each finishes (from a worker thread), e.g. for a progress bar.
    """
    jobs = [Job(code=j) if isinstance(j, str) else j for j in jobs]
    limits = limits or Limits()
    workers = concurrency or default_concurrency()
    boxes: queue.SimpleQueue | None = None
    if _use_warm(warm, mode):
        boxes = queue.SimpleQueue()
        for _ in range(min(workers, len(jobs))):
            boxes.put(WarmSandbox(work_dir_mb=limits.work_dir_mb))

    def one(i: int) -> Result:
        j = jobs[i]
        kw = {"stdin": j.stdin, "files": j.files, "argv": j.argv, "limits": j.limits or limits, "driver": j.driver}
        if boxes is None:
            r = run(j.code, mode=mode, **kw)
        else:
            box = boxes.get()
            try:
                r = box.run(j.code, **kw)
            finally:
                boxes.put(box)
        if on_result is not None:
            on_result(i, r)
        return r

    try:
        with ThreadPoolExecutor(max_workers=workers) as ex:
            return list(ex.map(one, range(len(jobs))))
    finally:
        while boxes is not None and not boxes.empty():
            boxes.get().close()
