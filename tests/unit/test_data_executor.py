"""executor.py's failure reporting without a cluster: sacct output parsing (Slurm) and the error line read from
a datatrove task log; datatrove-local's failing task becomes a DataTaskError naming that log."""

import pytest

from glmstack.data.executor import DataTaskError, run_units, slurm_failed_tasks


def test_sacct_states_of_failed_array_tasks():
    out = """777_0|COMPLETED
777_1|FAILED
777_2|RUNNING
777_3|CANCELLED by 1000
777_4|OUT_OF_MEMORY
777_[5-9]|PENDING
777_10|TIMEOUT"""
    assert slurm_failed_tasks(out) == {1: "FAILED", 3: "CANCELLED", 4: "OUT_OF_MEMORY", 10: "TIMEOUT"}
    assert slurm_failed_tasks("") == {}


def _boom(marker_dir, u):
    if u == 3:
        raise ValueError(f"unit {u} cannot be read")
    (marker_dir / f"{u}.done").write_text("ok")


def test_datatrove_local_failure_names_the_task_log(tmp_path):
    import functools

    fn = functools.partial(_boom, tmp_path)
    with pytest.raises(DataTaskError) as err:
        run_units(
            fn,
            list(range(4)),
            lambda u: tmp_path / f"{u}.done",
            executor="datatrove-local",
            workers=1,
            logging_dir=tmp_path / "logs",
            desc="filter",
            progress=False,
        )
    message = str(err.value)
    assert "ValueError: unit 3 cannot be read" in message
    log = tmp_path / "logs" / "filter" / "logs" / "task_00000.log"
    assert message.endswith(f"log: {log}") and log.exists()


class _SubmittedArray:
    """What _wait_slurm reads of datatrove's SlurmPipelineExecutor after submission."""

    def __init__(self, tmp_path, job_id):
        self.job_id, self.world_size, self.tasks_per_job = job_id, 4, 1
        self.slurm_logs_folder = str(tmp_path / "slurm_logs")


def _wait(tmp_path, job_id):
    from tqdm import tqdm

    from glmstack.data.executor import _wait_slurm

    done = lambda u: tmp_path / f"{u}.done"
    with tqdm(disable=True) as bar:
        _wait_slurm(_SubmittedArray(tmp_path, job_id), [0, 1, 2, 3], done, bar, tmp_path / "logs", poll_s=0.01)


def test_slurm_wait_stops_at_a_failed_array_task(tmp_path, monkeypatch):
    """A stand-in `sacct` on PATH (no Slurm here) reports task 2 of job 42 FAILED: the wait ends at once."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sacct").write_text("#!/bin/sh\nprintf '42_0|RUNNING\\n42_2|FAILED\\n42_[3]|PENDING\\n'\n")
    (bin_dir / "sacct").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    with pytest.raises(DataTaskError, match=r"data task 2 ended FAILED in Slurm job 42: .*task_00002\.log; Slurm"):
        _wait(tmp_path, 42)


def test_slurm_wait_without_accounting_reads_the_task_logs(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no sacct at all
    log = tmp_path / "logs" / "logs" / "task_00001.log"
    log.parent.mkdir(parents=True)
    log.write_text("2026-12-01 | ERROR | Traceback ...\n    raise OSError(...)\nOSError: disk quota exceeded\n")
    with pytest.raises(DataTaskError, match=r"data task 1 ended FAILED.*OSError: disk quota exceeded; log: "):
        _wait(tmp_path, 43)
