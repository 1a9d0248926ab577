"""Bad input ends in one clear line, never a traceback: each case runs the real `glmstack` CLI in a subprocess (exit
code 2, one line naming the file or field) and the API (the typed exception). Also the inputs that must be
accepted with a warning: a transformers-written checkpoint without its MTP layer, a half-written metrics.jsonl
line, the partial folders a killed save leaves behind.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from glmstack.config import apply_overrides
from glmstack.data.shards import ShardWriter
from glmstack.errors import CheckpointError, ConfigError, GlmstackError, TokenizerError
from glmstack.model import GLM, ModelConfig, load_hf, save_hf
from glmstack.recipes import load_config
from glmstack.tokenizer import Tokenizer
from glmstack.train import checkpoint, stage
from glmstack.train.metrics import Metrics, read_metrics

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # ~12 CLI processes (each imports torch)


def cli(*args: str, ok: bool = False) -> str:
    """Run `glmstack ARGS` as a user would; -> its output (stdout + stderr). A failure must be exit 2, one line."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "glmstack.cli", *args], capture_output=True, text=True, env=env,
                          timeout=300, cwd=ROOT)
    out = (proc.stdout + proc.stderr).strip()
    assert "Traceback" not in out, out
    if ok:
        assert proc.returncode == 0, out
        return out
    assert proc.returncode == 2, out
    assert len(out.splitlines()) == 1, out
    return out


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    """A tiny checkpoint folder with a tokenizer, as `glmstack generate` takes it."""
    folder = tmp_path_factory.mktemp("ckpt") / "model"
    save_hf(GLM(ModelConfig.preset("tiny")).init_weights(seed=0), folder)
    texts = ["def add(a, b):\n    return a + b\n", "the quick brown fox jumps over the lazy dog\n"] * 20
    Tokenizer.train(texts, vocab_size=300).save(folder)
    return folder


def copy_of(folder: Path, dest: Path) -> Path:
    import shutil

    return Path(shutil.copytree(folder, dest))


# ---------------------------------------------------------------- checkpoint files
def test_truncated_safetensors_names_the_file(ckpt, tmp_path):
    bad = copy_of(ckpt, tmp_path / "bad")
    weights = bad / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:5000])  # a download cut short
    out = cli("generate", str(bad), "--prompt", "a", "--max-new-tokens", "2")
    assert str(weights) in out and "truncated or corrupt" in out
    with pytest.raises(CheckpointError, match="model.safetensors: truncated or corrupt"):
        load_hf(bad)
    weights.write_bytes(b"\x00" * 64)  # not a safetensors file at all
    with pytest.raises(CheckpointError, match=str(weights)):
        load_hf(bad)


def test_config_json_not_json_or_missing_a_field(ckpt, tmp_path):
    bad = copy_of(ckpt, tmp_path / "bad")
    (bad / "config.json").write_text('{"model_type": "glm4_moe", ')
    out = cli("generate", str(bad), "--prompt", "a")
    assert f"{bad / 'config.json'}: not valid JSON" in out
    cfg = json.loads((ckpt / "config.json").read_text())
    del cfg["hidden_size"]  # no silent GLM-4.5 default of 4096
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="config.json: missing required field.*hidden_size"):
        load_hf(bad)
    with pytest.raises(ConfigError, match="no such file"):
        ModelConfig.from_hf(tmp_path / "nowhere")


def test_tokenizer_checked_first_and_named(ckpt, tmp_path):
    bad = copy_of(ckpt, tmp_path / "bad")
    (bad / "tokenizer.json").unlink()
    (bad / "model.safetensors").write_bytes(b"broken")  # the tokenizer error must come first: the model is not read
    out = cli("generate", str(bad), "--prompt", "a")
    assert f"{bad / 'tokenizer.json'}: not found" in out
    with pytest.raises(TokenizerError, match="tokenizer.json"):
        Tokenizer.load(bad)
    (bad / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="cannot be read"):
        Tokenizer.load(bad)


def test_checkpoint_without_mtp_loads_with_a_warning(tmp_path):
    """What transformers' save_pretrained writes: config says num_nextn_predict_layers 1, no MTP tensors."""
    folder = save_hf(GLM(ModelConfig.preset("tiny", num_nextn_predict_layers=0)).init_weights(seed=0), tmp_path / "hf")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "num_nextn_predict_layers": 1}))
    Tokenizer.train(["abc def ghi\n"] * 10, vocab_size=300).save(folder)
    out = cli("generate", str(folder), "--prompt", "abc", "--max-new-tokens", "2", ok=True)
    warnings = [line for line in out.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "no MTP layer" in warnings[0] and "without MTP" in warnings[0]
    assert len(load_hf(folder, missing_mtp="drop").mtp) == 0
    with pytest.raises(CheckpointError, match="num_nextn_predict_layers=0"):  # strict by default
        load_hf(folder)
    # training from it (init_from): MTP freshly initialised, said so; the trunk is the checkpoint's
    run_cfg = load_config("tiny", "pretrain", [f"init_from={folder}", f"out_dir={tmp_path / 'runs'}",
                                                     "steps=1", "log.val_every=0", "log.plots=false",
                                                     "log.progress=false", "ckpt.every=0"])
    model = stage.build_model(run_cfg, torch.device("cpu"))
    assert len(model.mtp) == 1
    torch.testing.assert_close(model.embed_tokens.weight, load_hf(folder, missing_mtp="drop").embed_tokens.weight)


# ---------------------------------------------------------------- configs
def test_config_values_checked_when_built():
    out = cli("pretrain", "tiny", "--set", 'model_overrides={"hiden_size": 64}', "--print-config")
    assert "model_overrides: unknown ModelConfig field(s) hiden_size" in out and "hidden_size" in out
    out = cli("pretrain", "tiny", "--set", 'data.options={"bogus": 1}')
    assert "data.options: unknown key(s) bogus" in out and "branching" in out
    base = load_config("tiny", "pretrain", [])
    for override, message in [
        ("data.packing=foo", "data.packing: 'foo' is not one of"),
        ("data.packing=best_fit", "needs data.kind=shards"),  # synthetic data has no documents to pack
        ("data.kind=shards", "data.path: empty"),
        ("device=gpu", "device: 'gpu' is not a torch device"),
        ("compile=maybe", "compile: 'maybe' is not one of"),
        ('model_overrides={"num_experts_per_tok": 99}', "num_experts_per_tok (99) must be <="),
    ]:
        with pytest.raises(ConfigError, match=re.escape(message)):
            apply_overrides(base, [override])


def test_tiny_recipe_packing_is_honest():
    """The tiny recipe's mid-training runs on synthetic data: it asks for no packing it cannot do."""
    out = cli("midtrain", "tiny", "--print-config", ok=True)
    assert json.loads(out)["data"]["packing"] == "concat"
    cli("midtrain", "tiny", "--set", "data.packing=best_fit", "--print-config")


def test_shard_vocab_larger_than_the_model(tmp_path):
    writer = ShardWriter(tmp_path / "shards", shard_tokens=1000, eos_id=0, vocab_size=1000)
    writer.add(list(range(900)))
    writer.close()
    overrides = ["data.kind=shards", f"data.path={tmp_path / 'shards'}", f"out_dir={tmp_path / 'runs'}"]
    out = cli("pretrain", "tiny", *[a for o in overrides for a in ("--set", o)])
    assert "index.json: the shards' tokenizer has 1000 ids but the model's vocab_size is 512" in out
    with pytest.raises(ConfigError, match="vocab_size"):
        stage.check_inputs(load_config("tiny", "pretrain", overrides))


# ---------------------------------------------------------------- resume
def test_resume_folder_without_trainer_state(tmp_path, ckpt):
    out = cli("pretrain", "tiny", "--resume", str(ckpt), "--set", f"out_dir={tmp_path}")
    assert "trainer_state" in out and str(ckpt) in out
    with pytest.raises(CheckpointError, match="trainer_state"):
        checkpoint.check_resumable(ckpt)


def test_latest_naming_a_missing_folder(tmp_path):
    stage_dir = tmp_path / "tiny" / "pretrain"
    stage_dir.mkdir(parents=True)
    (stage_dir / "latest").write_text("step_0000005\n")
    out = cli("pretrain", "tiny", "--set", f"out_dir={tmp_path}", "--set", "steps=1", "--set", "log.progress=false")
    assert "latest names 'step_0000005', which does not exist" in out
    with pytest.raises(CheckpointError, match="step_0000005"):
        checkpoint.latest(stage_dir)


def test_half_written_metrics_line_and_stale_partial_saves(tmp_path):
    """A kill mid-write leaves half a metrics.jsonl line and `..tmp_step_N.tmp-<pid>`: resume reads past the first
    and the stage start deletes the second."""
    common = [f"out_dir={tmp_path}", "log.val_every=0", "log.plots=false", "log.progress=false", "ckpt.every=1"]
    stage.run(load_config("tiny", "pretrain", common + ["steps=2"]))
    stage_dir = tmp_path / "tiny" / "pretrain"
    with open(stage_dir / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "loss": 4.')
    partial = [stage_dir / "..tmp_step_0000003.tmp-4242", stage_dir / ".tmp_step_0000003"]
    for p in partial:
        (p / "trainer_state").mkdir(parents=True)
    result = stage.run(load_config("tiny", "pretrain", common + ["steps=3"]))
    assert result["stopped"] == "done"
    assert [r["step"] for r in read_metrics(stage_dir / "metrics.jsonl")] == [1, 2, 3]
    assert not any(p.exists() for p in partial)
    Metrics(stage_dir).truncate_after(1)  # the strict reader that blocked this is gone: one tolerant reader
    assert [r["step"] for r in read_metrics(stage_dir / "metrics.jsonl")] == [1]


def test_every_error_is_a_glmstack_error():
    for cls in (ConfigError, CheckpointError, TokenizerError):
        assert issubclass(cls, GlmstackError) and issubclass(cls, ValueError)
