"""`glmstack speedrun` end to end at the one-minute budget: report written, losses fall, MTP accepts drafts and
speculative output equals plain greedy, an interrupted run (killed inside pre-training, SFT and the report card)
continues without redoing finished stages and gives the same figures and report card as a run straight through,
and `glmstack serve <run>/model` streams an answer with thinking to the openai client."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from glmstack import speedrun
from glmstack.recipes import speedrun as speedrun_recipe
from glmstack.recipes.speedrun import SIZES, size_for

STAGE_NAMES = ["tokenizer", "data", "pretrain", "midtrain", "sft", "rl", "evaluate", "card", "report"]


def _speedrun(out: Path, stop_after: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop(speedrun.STOP_ENV, None)
    if stop_after:
        env[speedrun.STOP_ENV] = stop_after
    cmd = [sys.executable, "-m", "glmstack.cli", "speedrun", "--out", str(out), "--minutes", "1", "--seed", "0"]
    return subprocess.run(cmd, check=False, env=env, capture_output=True, text=True, timeout=300)


def _kill_once(out: Path, written: str) -> str:
    """Start a speedrun and SIGKILL it once `out/written` exists (as a crash or Ctrl-C would); its stdout."""
    cmd = [sys.executable, "-m", "glmstack.cli", "speedrun", "--out", str(out), "--minutes", "1", "--seed", "0"]
    env = {k: v for k, v in os.environ.items() if k != speedrun.STOP_ENV} | {"OMP_NUM_THREADS": "1"}
    log = out.with_name(f"{out.name}-{written.replace('/', '-')}.log")
    proc = subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while not (out / written).exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    return log.read_text()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Run A stopped after the data stage, then killed inside pre-training, SFT and RL (after their first checkpoint)
    and inside the report card (after its first model), then finished; run B straight through. Both with seed 0."""
    base = tmp_path_factory.mktemp("speedrun")
    a, b = base / "a", base / "b"
    first = _speedrun(a, stop_after="data")
    assert first.returncode == speedrun.STOPPED_EXIT, first.stdout[-3000:] + first.stderr[-3000:]
    marks = {s: (a / s / "DONE.json").stat().st_mtime_ns for s in ("tokenizer", "data")}
    logs = {}
    kills = [("pretrain", "pretrain/latest"), ("sft", "sft/latest"), ("card", "card/pretrain.json")]
    if speedrun_recipe.rl(1) is not None:  # this checkout has the RL stage
        kills.insert(2, ("rl", "rl/latest"))
    for stage, written in kills:
        logs[stage] = _kill_once(a, written)
        assert (a / written).exists() and not (a / stage / "DONE.json").exists(), stage
    second = _speedrun(a)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    straight = _speedrun(b)
    assert straight.returncode == 0, straight.stdout[-3000:] + straight.stderr[-3000:]
    return {"a": a, "b": b, "marks": marks, "second": second, "logs": logs}


def _figures(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())["figures"]


@pytest.mark.slow
def test_report_and_figures(runs):
    out = runs["b"]
    report = (out / "report.md").read_text()
    assert "| figure | value |" in report
    for png in ("losses.png", "lr.png", "expert_load.png", "perplexity_by_position.png", "accepted_length.png"):
        assert (out / "plots" / png).stat().st_size > 1000, png
    assert "## Report card" in report and "## Conversations" in report and "<think>" in report
    fig = _figures(out)
    assert fig["sft val loss, last"] < fig["sft val loss, first"]
    assert fig["pretrain val loss, last"] < fig["pretrain val loss, first"]
    assert fig["midtrain val loss, last"] < fig["midtrain val loss, first"]
    assert fig["speculative output == greedy"] is True  # MTP drafting never changes greedy output
    assert fig["MTP mean accepted length"] > 1.0  # 1.0 = every draft rejected; more = drafts were accepted
    assert fig["MTP acceptance at depth 1"] > 0


@pytest.mark.slow
def test_rerun_continues_and_skips_finished_stages(runs):
    a, second = runs["a"], runs["second"]
    for stage, mtime in runs["marks"].items():
        assert (a / stage / "DONE.json").stat().st_mtime_ns == mtime, f"{stage} was redone"
        assert f"{stage}: done already" in second.stdout
    # each run after a kill continues the killed stage: pre-training (in the run killed in SFT), SFT (in the run
    # killed in the card), the report card (in the last run)
    pre = runs["logs"]["sft"].split("midtrain: 2x context")[0]
    assert "step     30/30" in pre and "step      1/" not in pre, "pre-training started over"
    after_sft_kill = runs["logs"]["rl" if "rl" in runs["logs"] else "card"]
    sft = after_sft_kill.split("] sft: ")[1].split("] rl: ")[0]
    assert "step     60/60" in sft and "step      1/" not in sft, "SFT started over"
    if "rl" in runs["logs"]:
        rl = runs["logs"]["card"].split("] rl: ")[1].split("] evaluate: ")[0]
        assert "resuming from" in rl and "step      1/" not in rl, "RL started over"
    assert "report card: pre-trained" not in second.stdout, "the report card started over"
    assert all((a / s / "DONE.json").exists() for s in STAGE_NAMES)


@pytest.mark.slow
def test_one_seed_same_figures(runs):
    """Killed-and-continued equals straight through, figure for figure and on the report card (wall-clock times are
    kept apart)."""
    assert _figures(runs["a"]) == _figures(runs["b"])
    card = json.loads((runs["b"] / "summary.json").read_text())["card"]
    assert card == json.loads((runs["a"] / "summary.json").read_text())["card"]
    assert list(card)[:3] == ["pre-trained", "mid-trained", "SFT"]
    # even 60 SFT steps of the 1-minute model move the chat-format metrics past the mid-trained model's
    for metric in ("thinking-switch obedience", "well-formed turns"):
        assert card["SFT"][metric] > card["mid-trained"][metric], metric


@pytest.mark.slow
def test_serve_streams_thinking(runs):
    """`glmstack serve <run>/model`, then the openai client: a streamed answer with thinking."""
    import openai
    from serve_fixture import free_port

    model = runs["b"] / "model"
    assert (model / "tokenizer_config.json").exists() and "chat_template" in (model / "tokenizer_config.json").read_text()
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    server = subprocess.Popen([sys.executable, "-m", "glmstack.cli", "serve", str(model), "--port", str(port),
                               "--device", "cpu", "--served-model-name", "speedrun"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=60)
        deadline = time.monotonic() + 120
        while True:
            try:
                client.models.list()
                break
            except openai.APIConnectionError:
                assert server.poll() is None and time.monotonic() < deadline, "server did not start"
                time.sleep(0.2)
        stream = client.chat.completions.create(
            model="speedrun", messages=[{"role": "user", "content": "What is 12 + 7?"}], max_tokens=48,
            temperature=0, stream=True, extra_body={"chat_template_kwargs": {"enable_thinking": True}},
        )  # fmt: skip
        chunks = [c for c in stream if c.choices]
        reasoning = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks)
        assert len(chunks) > 1 and reasoning.strip(), "no streamed reasoning"
        assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_stage_runner_skips_done_and_stops(tmp_path, monkeypatch):
    calls = []

    def stage(name):
        return name, name, lambda run: calls.append(name) or {"name": name}

    run = speedrun.Run(out=tmp_path, seed=0, minutes=1, size=size_for(1))
    stages = [stage("x"), stage("y"), stage("z")]
    monkeypatch.setenv(speedrun.STOP_ENV, "y")
    with pytest.raises(speedrun.StopRequested):
        speedrun.run_stages(run, stages)
    assert calls == ["x", "y"]
    monkeypatch.delenv(speedrun.STOP_ENV)
    results = speedrun.run_stages(run, stages)
    assert calls == ["x", "y", "z"] and results["x"]["name"] == "x"


def test_size_table_is_monotone():
    assert size_for(0.5) == SIZES[0] and size_for(20).minutes == 20 and size_for(19).minutes == 5
    steps = [s.pretrain_steps for s in SIZES]
    assert steps == sorted(steps)


def test_loss_by_position_tiny_model():
    import torch

    from glmstack.eval import loss_by_position, position_buckets
    from glmstack.model import GLM, ModelConfig

    model = GLM(ModelConfig.preset("tiny")).init_weights(seed=0)
    seqs = torch.randint(0, model.cfg.vocab_size, (3, 17))
    seqs[0, 5] = -100  # a padded target is left out of its position's mean
    nll = loss_by_position(model, seqs, batch_size=2)
    assert nll.shape == (16,) and torch.isfinite(nll).all()
    assert abs(nll.mean().item() - math.log(model.cfg.vocab_size)) < 0.5  # untrained: about log V
    starts, means = position_buckets(nll, 4)
    assert starts == [0, 4, 8, 12] and len(means) == 4


def test_report_from_metrics_files(tmp_path):
    from glmstack.report import write_report

    for stage, n in (("pretrain", 40), ("midtrain", 10)):
        rows = [{"step": i, "loss": 5 / i, "lm_loss": 4 / i, "lr": 1e-3, "moe/max_over_mean/0": 1 + 1 / i,
                 **({"val_loss": 4.5 / i} if i % 5 == 0 else {})} for i in range(1, n + 1)]
        (tmp_path / stage).mkdir()
        (tmp_path / stage / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 4')
    summary = {"figures": {"answer": 42}, "perplexity_by_position": {"m": [3.0] * 64},
               "speculative": {"histogram": {1: 0.5, 2: 0.5}, "mean_accepted": 1.5}}
    report = write_report(tmp_path, summary).read_text()
    assert "| answer | 42 |" in report
    for png in ("losses.png", "lr.png", "expert_load.png", "perplexity_by_position.png", "accepted_length.png"):
        assert f"plots/{png}" in report and (tmp_path / "plots" / png).exists()
