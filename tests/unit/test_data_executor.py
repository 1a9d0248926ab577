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
