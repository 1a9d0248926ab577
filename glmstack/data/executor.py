"""Run a per-unit function over work units: in-process, on a process pool, or on Slurm / Ray via datatrove.

The pipeline cuts its input into fixed-size units (a unit = `unit_docs` documents in read order) and every
parallel stage is a pure function of one unit that writes its results to files named after the unit, ending
with a marker file. That makes the stage
  - deterministic: outputs depend on the unit, never on which worker ran it or how many there were;
  - resumable: a unit whose marker exists is skipped on a rerun;
  - portable: datatrove's executors (LocalPipelineExecutor / SlurmPipelineExecutor / RayPipelineExecutor) run
    the same function as `tasks` ranks, each taking units rank, rank + world_size, ... (research spec §3.1, §11).
A failed task fails the build with a `DataTaskError` naming the task's log (`<logging_dir>/<stage>/logs/
task_NNNNN.log`): Ray and datatrove-local report it when their run returns, a Slurm job array through `sacct`
within one poll (5 s) of the task ending, so nothing waits on markers that will never come.
"""

from __future__ import annotations

import multiprocessing as mp
import shutil
import subprocess
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
        _run_datatrove(fn, todo, executor, workers, Path(logging_dir) / desc, options or {}, done, bar)
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


def _run_datatrove(fn, units, executor: str, workers: int, logging_dir: Path, options: dict, done, bar) -> None:
    """Hand the units to a datatrove executor with `workers` tasks; `options` go to its constructor.

    Ray and datatrove-local return when every task has ended, failed or not (datatrove logs a failure and goes
    on), so the completion markers are checked at once. A Slurm submission returns at once: the driver polls the
    unit markers and the job's state (`sacct`) and stops at the first failed task. Either way a failure is a
    DataTaskError naming the task's log."""
    if not units:
        return
    shutil.rmtree(logging_dir, ignore_errors=True)  # completions/ of an earlier attempt must not count
    step = _unit_step(fn, units)
    tasks = max(1, min(workers, len(units)))
    common = dict(pipeline=[step], tasks=tasks, logging_dir=str(logging_dir), skip_completed=False, **options)
    if executor == "slurm":
        from datatrove.executor import SlurmPipelineExecutor

        common.setdefault("time", "02:00:00")
        common.setdefault("partition", "cpu")
        common.setdefault("job_name", "glmstack-data")
        slurm = SlurmPipelineExecutor(**common)
        slurm.run()
        _wait_slurm(slurm, units, done, bar, logging_dir)
        return
    error = None
    if executor == "ray":
        from datatrove.executor import RayPipelineExecutor

        RayPipelineExecutor(**common).run()
    else:
        from datatrove.executor import LocalPipelineExecutor

        try:
            LocalPipelineExecutor(workers=tasks, start_method="fork", **common).run()
        except Exception as e:  # noqa: BLE001 - a task's own error, of any type: reported below with its log
            error = e
    failed = [r for r in range(tasks) if not (logging_dir / "completions" / f"{r:05d}").exists()]
    if failed:
        raise DataTaskError(_failure_message(logging_dir, failed)) from error
    bar.update(len(units))


class DataTaskError(RuntimeError):
    """A distributed task of the data build failed; the message names the task's log file."""


def _failure_message(logging_dir: Path, ranks: list[int], why: str = "failed") -> str:
    rank = ranks[0]
    log = logging_dir / "logs" / f"task_{rank:05d}.log"
    last = _last_error(log)
    more = f" ({len(ranks) - 1} more task(s) did not finish)" if len(ranks) > 1 else ""
    return f"data task {rank} {why}{more}: {last or 'no error in its log'}; log: {log}"


def _last_error(log: Path) -> str:
    """The last line of the exception datatrove wrote to the task log (loguru: 'Type: message' at the end)."""
    if not log.exists():
        return ""
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    for ln in reversed(lines):
        if ln.split(":", 1)[0].rsplit(".", 1)[-1].endswith(("Error", "Exception", "Interrupt", "Exit")):
            return ln
    return ""


# sacct states of a task that will never write its marker
SLURM_FAILED = ("FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "BOOT_FAIL", "DEADLINE")


def slurm_failed_tasks(sacct_output: str) -> dict[int, str]:
    """Array task index -> state for the failed tasks in `sacct -n -P -X -o JobID,State` output
    (lines like `1234_7|FAILED`, `1234_[8-15]|PENDING`, `1234_3|CANCELLED by 1000`)."""
    failed = {}
    for line in sacct_output.splitlines():
        job, _, state = line.strip().partition("|")
        index = job.partition("_")[2]
        if index.isdigit() and state.split(" ")[0] in SLURM_FAILED:
            failed[int(index)] = state.split(" ")[0]
    return failed


def _sacct(job_id) -> str:
    try:
        res = subprocess.run(
            ["sacct", "-n", "-P", "-X", "-j", str(job_id), "-o", "JobID,State"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""  # no accounting here: the markers (and the time limit) are all we have
    return res.stdout if res.returncode == 0 else ""


def _slurm_failures(slurm, logging_dir: Path) -> dict[int, str]:
    """Failed ranks from sacct; where accounting is off, ranks whose task log ends in an exception."""
    out = _sacct(slurm.job_id) if slurm.job_id not in (None, -1) else ""
    if out:  # array task i ran ranks i * tasks_per_job ...: name the first
        return {i * slurm.tasks_per_job: state for i, state in slurm_failed_tasks(out).items()}
    return {
        r: "FAILED"
        for r in range(slurm.world_size)
        if not (logging_dir / "completions" / f"{r:05d}").exists()
        and _last_error(logging_dir / "logs" / f"task_{r:05d}.log")
    }


def _wait_slurm(slurm, units: list[int], done: Callable[[int], Path], bar, logging_dir: Path, poll_s: float = 5.0):
    """Until every unit's marker exists: poll the markers and, through sacct, the job array's task states.
    Only the last array datatrove submitted is watched (one array holds up to its max_array_size = 1001 tasks)."""
    pending = list(units)
    while pending:
        still = [u for u in pending if not done(u).exists()]
        bar.update(len(pending) - len(still))
        pending = still
        if not pending:
            return
        failed = _slurm_failures(slurm, logging_dir)
        if failed:
            ranks = sorted(failed)
            why = f"ended {failed[ranks[0]]} in Slurm job {slurm.job_id}"
            slurm_log = Path(slurm.slurm_logs_folder) / f"{slurm.job_id}_{ranks[0] // slurm.tasks_per_job}.out"
            raise DataTaskError(_failure_message(logging_dir, ranks, why) + f"; Slurm output: {slurm_log}")
        time.sleep(poll_s)
