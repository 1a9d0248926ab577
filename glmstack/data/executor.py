"""Run a per-unit function over work units: in-process, on a process pool, or on Slurm / Ray via datatrove.

The pipeline cuts its input into fixed-size units (a unit = `unit_docs` documents in read order) and every
parallel stage is a pure function of one unit that writes its results to files named after the unit, ending
with a marker file. That makes the stage
  - deterministic: outputs depend on the unit, never on which worker ran it or how many there were;
  - resumable: a unit whose marker exists is skipped on a rerun;
  - portable: datatrove's executors (LocalPipelineExecutor / SlurmPipelineExecutor / RayPipelineExecutor) run
    the same function as `tasks` ranks, each taking units rank, rank + world_size, ... (research spec §3.1, §11).
The driver waits until every unit's marker exists, so an asynchronous Slurm submission works the same way.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tqdm import tqdm


def _call(args):
    fn, unit = args
    fn(unit)
    return unit


def run_units(
    fn: Callable[[int], None],
    units: list[int],
    done: Callable[[int], Path],
    *,
    executor: str = "local",
    workers: int = 1,
    desc: str = "",
    progress: bool = True,
    logging_dir: str | Path = "",
    options: dict[str, Any] | None = None,
) -> None:
    """Run `fn(unit)` for every unit whose `done(unit)` marker is missing."""
    todo = [u for u in units if not done(u).exists()]
    bar = tqdm(
        total=len(units),
        initial=len(units) - len(todo),
        desc=desc,
        unit="unit",
        disable=not progress,
        dynamic_ncols=True,
    )
    if executor == "local" or (executor == "processes" and workers <= 1):
        for u in todo:
            fn(u)
            bar.update()
    elif executor == "processes":
        # fork: workers inherit the tokenizer and config without pickling them per task (Linux/macOS)
        with mp.get_context("fork").Pool(workers) as pool:
            for _ in pool.imap_unordered(_call, [(fn, u) for u in todo]):
                bar.update()
    elif executor in ("slurm", "ray", "datatrove-local"):
        _run_datatrove(fn, todo, executor, workers, logging_dir, options or {})
        _wait(todo, done, bar)
    else:
        raise ValueError(f"unknown executor {executor!r}; expected local, processes, slurm, ray or datatrove-local")
    bar.close()
    missing = [u for u in units if not done(u).exists()]
    if missing:
        raise RuntimeError(f"{desc}: {len(missing)} unit(s) did not finish (first: {missing[0]})")


def _unit_step(fn: Callable[[int], None], units: list[int]):
    from datatrove.pipeline.base import PipelineStep

    class UnitStep(PipelineStep):
        name = "glmstack units"
        type = "glmstack"

        def run(self, data, rank: int = 0, world_size: int = 1):
            for u in units[rank::world_size]:
                fn(u)
            yield from ()

    return UnitStep()


def _run_datatrove(fn, units, executor: str, workers: int, logging_dir, options: dict) -> None:
    """Hand the units to a datatrove executor with `workers` tasks; `options` go to its constructor."""
    if not units:
        return
    step = _unit_step(fn, units)
    tasks = max(1, min(workers, len(units)))
    common = dict(pipeline=[step], tasks=tasks, logging_dir=str(logging_dir), skip_completed=False, **options)
    if executor == "slurm":
        from datatrove.executor import SlurmPipelineExecutor

        common.setdefault("time", "02:00:00")
        common.setdefault("partition", "cpu")
        common.setdefault("job_name", "glmstack-data")
        SlurmPipelineExecutor(**common).run()
    elif executor == "ray":
        from datatrove.executor import RayPipelineExecutor

        RayPipelineExecutor(**common).run()
    else:
        from datatrove.executor import LocalPipelineExecutor

        LocalPipelineExecutor(workers=tasks, start_method="fork", **common).run()


def _wait(units: list[int], done: Callable[[int], Path], bar, poll_s: float = 5.0, timeout_s: float = 7 * 24 * 3600):
    """Block until every unit's marker exists (a Slurm job array returns before its tasks run)."""
    start, pending = time.time(), list(units)
    while pending and time.time() - start < timeout_s:
        still = [u for u in pending if not done(u).exists()]
        bar.update(len(pending) - len(still))
        pending = still
        if pending:
            time.sleep(poll_s)
