"""`glmstack speedrun` end to end at the one-minute budget: report written, losses fall, MTP accepts drafts and
speculative output equals plain greedy, an interrupted run (killed inside pre-training, SFT and the report card)
continues without redoing finished stages and gives the same figures and report card as a run straight through,
and `glmstack serve <run>/model` streams an answer with thinking to the openai client."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from glmstack import speedrun
from glmstack.recipes.speedrun import SIZES, size_for

STAGE_NAMES = ["tokenizer", "data", "pretrain", "midtrain", "sft", "rl", "agentic", "general", "evaluate", "card",
               "report"]  # fmt: skip
POSTTRAIN = ["sft", "rl", "agentic", "general"]


def _speedrun(out: Path, stop_after: str | None = None, import_times: bool = False) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop(speedrun.STOP_ENV, None)
    if stop_after:
        env[speedrun.STOP_ENV] = stop_after
    if import_times:  # every import on stderr ("import time: ... | module"); the sandbox's python -I ignores it
        env["PYTHONPROFILEIMPORTTIME"] = "1"
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
    """Run A stopped after the data stage, then killed inside pre-training and inside each post-training stage (SFT,
    reasoning RL, agentic RL, general RL: after their first checkpoint) and inside the report card (after its first
    model), then finished; run B straight through. Both with seed 0."""
    base = tmp_path_factory.mktemp("speedrun")
    a, b = base / "a", base / "b"
    first = _speedrun(a, stop_after="data")
    assert first.returncode == speedrun.STOPPED_EXIT, first.stdout[-3000:] + first.stderr[-3000:]
    marks = {s: (a / s / "DONE.json").stat().st_mtime_ns for s in ("tokenizer", "data")}
    logs = {}
    kills = [("pretrain", "pretrain/latest"), *((s, f"{s}/latest") for s in POSTTRAIN), ("card", "card/pretrain.json")]
    for stage, written in kills:
        logs[stage] = _kill_once(a, written)
        assert (a / written).exists() and not (a / stage / "DONE.json").exists(), stage
    second = _speedrun(a)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    straight = _speedrun(b, import_times=True)
    errors = "\n".join(x for x in straight.stderr.splitlines() if not x.startswith("import time:"))
    assert straight.returncode == 0, straight.stdout[-3000:] + errors[-3000:]
    return {"a": a, "b": b, "marks": marks, "second": second, "logs": logs, "imports": straight.stderr}


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
    # reasoning and general RL distil the tool skills with thinking off and on, on every step (recipes/speedrun.py)
    for stage, prefix in (("rl", "teacher_reward/"), ("general", "reward/")):
        rows = [json.loads(x) for x in (out / stage / "metrics.jsonl").read_text().splitlines()]
        want = {f"{prefix}{task}:{mode}" for task in ("tools", "tool_answer") for mode in ("think", "nothink")}
        assert len(rows) > 1 and all(want <= set(r) for r in rows), stage
    # the decoding line: batch size, k, accepted length and the bound computed from the measured phase times
    spec = json.loads((out / "summary.json").read_text())["speculative"]
    ms, tau = spec["phase_ms"], spec["mean_accepted"]
    assert spec["speedup_bound"] == pytest.approx(tau * ms["plain"] / (ms["verify_4"] + 3 * ms["mtp_step"]))
    line = next(s for s in report.splitlines() if s.startswith("Greedy decoding"))
    for part in (f"batch size {spec['batch']}", "(k = 3)", f"emitted {tau:.2f} tokens", "at most",
                 f"= {spec['speedup_bound']:.2f}x"):  # fmt: skip
        assert part in line, (part, line)


@pytest.mark.slow
def test_the_speedrun_imports_only_what_make_speedrun_installs(runs):
    """Every third-party module that glmstack imports outside an ImportError guard and a whole run imported
    (PYTHONPROFILEIMPORTTIME) is installed by the Makefile's speedrun target, which installs less than `make install`
    (this venv has everything, so a package `make speedrun` lacks would pass unnoticed otherwise)."""
    pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")
    from importlib.metadata import packages_distributions

    from installs import installed_by_make, norm, unguarded_imports

    lines = re.finditer(r"^import time:[^|]*\|[^|]*\| +(\w+)", runs["imports"], re.MULTILINE)
    imported = {m.group(1) for m in lines}
    needed = sorted(imported & set(unguarded_imports()))
    assert {"torch", "numpy", "tokenizers", "tqdm"} <= set(needed)  # the parse found the run's imports
    have, dists = installed_by_make("$(BIN)/.speedrun-installed"), packages_distributions()
    missing = {m: dists.get(m) for m in needed if not {norm(d) for d in dists.get(m, [m])} & have}
    assert not missing, f"imported by the speedrun but not installed by `make speedrun`: {missing}"


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
    sft = runs["logs"]["rl"].split("] sft: ")[1].split("] rl: ")[0]
    steps = size_for(1).sft_steps
    assert f"step {steps:6d}/{steps}" in sft and "step      1/" not in sft, "SFT started over"
    # the run after each RL stage's kill: that stage resumed from its checkpoint, then the next stage began
    for stage, nxt, log in (("rl", "agentic", "agentic"), ("agentic", "general", "general"),
                            ("general", "evaluate", "card")):  # fmt: skip
        part = runs["logs"][log].split(f"] {stage}: ")[1].split(f"] {nxt}: ")[0]
        assert "resuming from" in part and "step      1/" not in part, f"{stage} started over"
    assert "report card: pre-trained" not in second.stdout, "the report card started over"
    assert all((a / s / "DONE.json").exists() for s in STAGE_NAMES)


@pytest.mark.slow
def test_one_seed_same_figures(runs):
    """Killed-and-continued equals straight through, figure for figure and on the report card (wall-clock times are
    kept apart)."""
    assert _figures(runs["a"]) == _figures(runs["b"])
    card = json.loads((runs["b"] / "summary.json").read_text())["card"]
    assert card == json.loads((runs["a"] / "summary.json").read_text())["card"]
    assert list(card) == ["pre-trained", "mid-trained", "SFT", "reasoning RL", "agentic RL", "general RL"]
    assert all(isinstance(col["tool task success"], float) and isinstance(col["reasoning task accuracy"], float)
               for col in card.values())  # fmt: skip
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


def _python(code: str, cwd=None, timeout=300) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop(speedrun.STOP_ENV, None)
    return subprocess.run([sys.executable, "-c", code], check=False, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


HIDE_BFCL = "import sys; sys.modules['bfcl_eval'] = None; "  # what Python sees where bfcl-eval was never installed


@pytest.mark.slow
@pytest.mark.slow
def test_probe_uses_the_cards_definitions_on_another_draw(runs):
    """`python -m glmstack.speedrun.probe RUN MODEL` prints the two function metrics; on the card's own draw and counts
    it gives the card's figures for that model (the same definitions), by default another draw."""
    from glmstack.recipes.speedrun import Size
    from glmstack.speedrun.probe import probe
    from glmstack.speedrun.run import Run

    out = runs["b"]
    meta = json.loads((out / "speedrun.json").read_text())
    run = Run(out=out, seed=meta["seed"], minutes=meta["minutes"], size=Size(**meta["size"]))
    card = json.loads((out / "summary.json").read_text())["card"]["SFT"]
    same = probe(run, out / "sft" / "model", n=run.size.card_n, reasoning_n=4 * run.size.card_n, draw=0)
    for metric in ("tool task success", "tool-call validity", "reasoning task accuracy"):
        assert same[metric] == card[metric], metric
    cli = _python(f"from glmstack.speedrun.probe import main; raise SystemExit(main({[str(out), str(out / 'sft' / 'model'), '--n', '4']!r}))")
    assert cli.returncode == 0, cli.stderr[-3000:]
    printed = json.loads(cli.stdout.strip().splitlines()[-1])
    assert printed["n"] == 4 and set(printed) >= {"tool task success", "reasoning task accuracy"}


def test_card_without_an_optional_package(runs, tmp_path):
    """bfcl-eval hidden from the interpreter: the card and report stages of a finished run, redone, finish; the BFCL
    row reads "not installed", every other metric is a number; `glmstack eval --tasks bfcl` says so in one line."""
    out = tmp_path / "run"
    shutil.copytree(runs["b"], out)
    for stage in ("card", "report"):
        shutil.rmtree(out / stage)
    argv = ["--out", str(out), "--minutes", "1", "--seed", "0"]
    done = _python(HIDE_BFCL + f"from glmstack.speedrun import main; raise SystemExit(main({argv!r}))")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    card = json.loads((out / "summary.json").read_text())["card"]
    assert {col["BFCL simple"] for col in card.values()} == {"not installed (bfcl-eval)"}
    assert all(isinstance(v, float) for col in card.values() for k, v in col.items() if k != "BFCL simple")
    assert "| BFCL simple | not installed (bfcl-eval) |" in (out / "report.md").read_text()
    argv = ["--model", str(out / "sft" / "model"), "--tasks", "bfcl", "--limit", "1", "--out", str(tmp_path / "e")]
    ev = _python(HIDE_BFCL + f"from glmstack.eval.cli import main; raise SystemExit(main({argv!r}))")
    assert ev.returncode == 2 and "task bfcl needs the bfcl-eval package" in ev.stderr, ev.stderr[-3000:]


# README commands the test does not run, and why
NOT_RUN = {
    "glmstack speedrun [--out runs/speedrun] [--minutes 20] [--seed 0]": "the synopsis of what made the folders (the "
    "fixture ran it with --minutes 1)",
    "glmstack sft sft_speedrun": "trains SFT again into runs/speedrun/sft (the speedrun's sft stage ran it)",
    "GLMSTACK_API_KEY=secret glmstack serve ...": "a placeholder (`...`) for the commands above",
}


def readme_commands() -> list[str]:
    """The README's commands on a speedrun's folders: inline `glmstack ... runs/speedrun...` spans and the lines of
    its indented command blocks that start with glmstack (or pipe into it), comments cut."""
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    found = re.findall(r"`((?:echo [^`|]*\| )?glmstack [^`]*runs/speedrun[^`]*)`", text)
    for line in text.splitlines():
        cmd = line[4:].split("  #")[0].strip() if line.startswith("    ") else ""
        if re.match(r"(\w+=\S+ )?(echo .*\| )?glmstack ", cmd):
            found.append(cmd)
    return list(dict.fromkeys(found))


@pytest.mark.slow
def test_readme_commands_on_a_speedrun(runs, tmp_path):
    """Each README command on a speedrun's folders, verbatim, in a folder whose runs/speedrun is the 1-minute run
    (port 8000 swapped for a free one): exits 0. Each server starts and answers; the last one stays up while the
    other commands run, so the endpoint command has it to talk to."""
    from serve_fixture import free_port

    commands = readme_commands()
    assert set(NOT_RUN) <= set(commands), "NOT_RUN names a command the README no longer has"
    todo = [c for c in commands if c not in NOT_RUN and ("runs/speedrun" in c or "--endpoint" in c)]
    serves = [c for c in todo if c.startswith("glmstack serve")]
    others = [c for c in todo if c not in serves]
    assert serves and any(c.startswith("glmstack eval --model runs/speedrun") for c in others), todo
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "speedrun").symlink_to(runs["b"])
    port = str(free_port())
    shell = f'glmstack() {{ "{sys.executable}" -m glmstack.cli "$@"; }}; '  # the checkout under test
    env = {k: v for k, v in os.environ.items() if k != speedrun.STOP_ENV} | {"OMP_NUM_THREADS": "1"}

    def swap_port(cmd: str) -> str:
        cmd = cmd.replace(":8000/", f":{port}/").replace("--port 8000", f"--port {port}")
        return cmd if "--port" in cmd or not cmd.startswith("glmstack serve") else f"{cmd} --port {port}"

    for i, cmd in enumerate(serves):
        server = subprocess.Popen(["bash", "-c", shell + swap_port(cmd)], cwd=tmp_path, env=env, text=True,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)  # fmt: skip
        try:
            _wait_for(port, server, cmd)
            if i == len(serves) - 1:
                for other in others:
                    stdin = "What is 2 + 3?\n" if "glmstack chat" in other and "|" not in other else ""
                    res = subprocess.run(["bash", "-c", shell + swap_port(other)], check=False, cwd=tmp_path, env=env,
                                         text=True, input=stdin, capture_output=True, timeout=300)  # fmt: skip
                    assert res.returncode == 0, (other, res.stdout[-2000:], res.stderr[-2000:])
        finally:
            os.killpg(server.pid, 15)  # the shell and the server it started
            server.wait(timeout=30)
    assert (tmp_path / "runs" / "eval" / "report.md").exists()


def _wait_for(port: str, server: subprocess.Popen, cmd: str) -> None:
    import urllib.request

    deadline = time.monotonic() + 120
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5)
            return
        except OSError:
            assert server.poll() is None, (cmd, server.stderr.read()[-3000:])
            assert time.monotonic() < deadline, f"{cmd}: no answer in 120 s"
            time.sleep(0.3)


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
        rows = [
            {
                "step": i,
                "loss": 5 / i,
                "lm_loss": 4 / i,
                "lr": 1e-3,
                "moe/max_over_mean/0": 1 + 1 / i,
                **({"val_loss": 4.5 / i} if i % 5 == 0 else {}),
            }
            for i in range(1, n + 1)
        ]
        (tmp_path / stage).mkdir()
        (tmp_path / stage / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 4')
    summary = {
        "figures": {"answer": 42},
        "perplexity_by_position": {"m": [3.0] * 64},
        "speculative": {"histogram": {1: 0.5, 2: 0.5}, "mean_accepted": 1.5},
    }
    report = write_report(tmp_path, summary).read_text()
    assert "| answer | 42 |" in report
    for png in ("losses.png", "lr.png", "expert_load.png", "perplexity_by_position.png", "accepted_length.png"):
        assert f"plots/{png}" in report and (tmp_path / "plots" / png).exists()


def test_decoding_line_says_why():
    """The report's decoding line: batch size, k, accepted length, what a round costs and the bound, with the
    verdict the bound gives (a summary without the cost model keeps the short line)."""
    from glmstack.report import decode_line

    spec = {"draft_k": 3, "batch": 8, "new_tokens": 48, "mean_accepted": 1.8, "tokens_per_s_plain": 5843.0,
            "tokens_per_s_mtp": 2759.0, "phase_ms": {"plain": 1.0, "verify_4": 2.5, "mtp_step": 0.5},
            "round_over_plain": 4.0, "speedup_bound": 0.45}  # fmt: skip
    line = decode_line(spec)
    for part in ("batch size 8", "48 new tokens", "5843 tokens/s plain", "2759 tokens/s with MTP", "(k = 3), 0.47x",
                 "emitted 1.80 tokens", "cost 4.00 plain decode steps", "4 positions 2.50", "3 MTP steps 0.50 each",
                 "at most 1.80 / 4.00 = 0.45x", "cannot be faster than plain decoding"):  # fmt: skip
        assert part in line, (part, line)
    assert "leaves out" not in line  # measured 0.47x >= the bound 0.45x
    faster = decode_line(spec | {"speedup_bound": 1.5})
    assert "can be at most 1.50x as fast" in faster and "The measured 0.47x is below the bound" in faster
    old = {k: spec[k] for k in ("draft_k", "tokens_per_s_plain", "tokens_per_s_mtp")}
    assert decode_line(old).endswith("2759 tokens/s with MTP drafting (k = 3).")
