"""SIGKILL in the middle of writing a checkpoint: `latest` still names the previous complete one, and a restart
continues from it (a real subprocess running `glmstack pretrain`)."""

import os
import signal
import subprocess
import sys
import time

from glmstack.train import checkpoint

ARGS = [
    "seq_len=32",
    "micro_batch_size=2",
    "log.progress=false",
    "log.plots=false",
    "log.val_every=0",
    "ckpt.every=2",
    "steps=6",
    "schedule.batch_warmup_tokens=0",
]


def _cmd(out_dir):
    sets = [x for a in ARGS + [f"out_dir={out_dir}"] for x in ("--set", a)]
    return [sys.executable, "-m", "glmstack.cli", "pretrain", "tiny", *sets]


def test_sigkill_while_writing_keeps_previous_checkpoint(tmp_path):
    stage = tmp_path / "tiny" / "pretrain"
    env = {**os.environ, "GLMSTACK_CKPT_PAUSE": "4:60"}  # the step-4 checkpoint sleeps before its rename
    proc = subprocess.Popen(_cmd(tmp_path), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 240
        while not (stage / ".tmp_step_0000004" / "trainer_state" / "state.pt").exists():
            assert proc.poll() is None and time.time() < deadline, "the run ended before writing step 4"
            time.sleep(0.2)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert checkpoint.latest(stage).name == "step_0000002"  # the half-written step 4 is never `latest`
    assert not (stage / "step_0000004").exists()
    out = subprocess.run(_cmd(tmp_path), check=False, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "step 2)" in out.stdout  # "resuming from .../step_0000002 (step 2)"
    assert checkpoint.latest(stage).name == "step_0000006"
    assert not list(stage.glob(".tmp_*"))
