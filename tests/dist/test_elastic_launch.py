"""torchrun launches through the CLI (issue 27): a killed rank restarts the job from `latest`, and two torchrun
agents on loopback rehearse a two-node launch with c10d rendezvous. Both must log the losses of an uninterrupted
run: the single-process run on the same global batch (2 micro-batches accumulated), within 1e-5 relative
(DDP vs one process sums gradients in another order: last-bit differences, tests/dist/test_train_dist.py measured
0.0; fp32 Newton–Schulz keeps bf16 rounding from amplifying them).
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tiny_runs import TINY, free_port

from glmstack.recipes import load_config
from glmstack.train.stage import run

pytestmark = [pytest.mark.dist, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
STEPS = 8
BASE = TINY + [f"steps={STEPS}", "ckpt.every=2", "optim.ns_dtype=float32", "dist.dp=ddp"]
TOL = 1e-5


def _losses(out: Path) -> dict[int, float]:
    path = out / "tiny" / "pretrain" / "metrics.jsonl"
    if not path.exists():
        return {}
    rows = [json.loads(r) for r in path.read_text().splitlines() if r.endswith("}")]
    return {r["step"]: r["loss"] for r in rows}


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[int, float]:
    out = tmp_path_factory.mktemp("single")
    run(load_config("tiny", "pretrain", BASE + ["grad_accum=2", "dist.dp=none", f"out_dir={out}"]))
    return _losses(out)


class _Agent:
    """A `torchrun ... -m glmstack.cli pretrain tiny` process whose output goes to a file (a pipe nobody reads
    while the test waits could fill up and stall the job)."""

    def __init__(self, out: Path, *launch: str, name: str = "agent"):
        cmd = [sys.executable, "-m", "torch.distributed.run", *launch, "-m", "glmstack.cli", "pretrain", "tiny"]
        cmd += [a for o in BASE + [f"out_dir={out}"] for a in ("--set", o)]
        env = os.environ | {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        self.log_path = out / f"{name}.log"
        out.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)

    def log(self) -> str:
        return self.log_path.read_text()

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"torchrun did not finish in {timeout} s:\n{self.log()[-6000:]}") from None


def _workers(agent_pid: int) -> dict[int, int]:
    """{rank: pid} of the worker processes a torchrun agent started (read from /proc)."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            if ppid != agent_pid:
                continue
            env = dict(kv.split("=", 1) for kv in (stat.parent / "environ").read_text().split("\0") if "=" in kv)
        except (OSError, IndexError, ValueError):
            continue
        if "RANK" in env:
            found[int(env["RANK"])] = int(stat.parent.name)
    return found


def _assert_same_losses(got: dict[int, float], want: dict[int, float]) -> None:
    assert sorted(got) == list(range(1, STEPS + 1)), got
    worst = max(abs(got[s] - want[s]) / abs(want[s]) for s in got)
    print(f"max relative loss difference to the uninterrupted run: {worst:.2e}")
    assert worst <= TOL, (got, want)


def test_killed_rank_restarts_all_ranks_from_latest(tmp_path, reference):
    port = free_port()
    agent = _Agent(
        tmp_path,
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
    )
    deadline = time.time() + 240
    while len(_losses(tmp_path)) < 3:  # step 2's checkpoint is written before step 3 is logged
        assert agent.proc.poll() is None and time.time() < deadline, agent.log()
        time.sleep(0.05)
    os.kill(_workers(agent.proc.pid)[1], signal.SIGKILL)  # rank 1 dies mid-run
    assert agent.wait(timeout=300) == 0, agent.log()
    assert "resuming from" in agent.log(), agent.log()  # every rank restarted from the newest complete checkpoint
    _assert_same_losses(_losses(tmp_path), reference)


def test_two_torchrun_agents_rehearse_two_nodes(tmp_path, reference):
    endpoint = f"127.0.0.1:{free_port()}"
    launch = (
        "--nnodes",
        "2",
        "--nproc-per-node",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        endpoint,
        "--rdzv-id",
        "rehearsal",
    )
    agents = [_Agent(tmp_path, *launch, name=f"node{i}") for i in range(2)]
    codes = [a.wait(timeout=300) for a in agents]
    assert codes == [0, 0], [a.log() for a in agents]
    _assert_same_losses(_losses(tmp_path), reference)
