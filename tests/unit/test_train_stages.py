"""pretrain -> midtrain: midtrain starts from the pretrain checkpoint with the new RoPE base and context."""

import torch
from safetensors.torch import load_file

from glmstack.model import ModelConfig, load_hf
from glmstack.recipes import load_config
from glmstack.train import checkpoint
from glmstack.train.markov_stream import SyntheticLM
from glmstack.train.metrics import read_metrics
from glmstack.train.stage import run

FAST = [
    "micro_batch_size=2",
    "log.progress=false",
    "log.plots=false",
    "log.val_every=0",
    "ckpt.every=0",
    "schedule.batch_warmup_tokens=0",
]


def _weights(folder):
    return {k: v for f in folder.glob("*.safetensors") for k, v in load_file(str(f)).items()}


def test_midtrain_continues_from_pretrain(tmp_path):
    run(load_config("tiny", "pretrain", FAST + [f"out_dir={tmp_path}", "steps=2", "seq_len=16"]))
    pre = checkpoint.latest(tmp_path / "tiny" / "pretrain")
    mid_cfg = load_config("tiny", "midtrain", FAST + [f"out_dir={tmp_path}", "steps=0", "seq_len=32"])
    assert mid_cfg.init_from == "tiny/pretrain" and mid_cfg.schedule.step_offset > 0
    run(mid_cfg)
    mid = checkpoint.latest(tmp_path / "tiny" / "midtrain")
    a, b = _weights(pre), _weights(mid)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert ModelConfig.from_hf(pre).rope_theta == 1e4 and ModelConfig.from_hf(mid).rope_theta == 1e6
    result = run(load_config("tiny", "midtrain", FAST + [f"out_dir={tmp_path}", "steps=1", "seq_len=32"]))
    assert result["step"] == 1
    # its first step's LM loss is the pre-trained model's (RoPE base 1e6) on the first mid-training batch
    first = read_metrics(tmp_path / "tiny" / "midtrain" / "metrics.jsonl")[0]
    batch = SyntheticLM(vocab_size=512, seq_len=32, batch_size=2, seed=0).batch(0)
    with torch.no_grad():
        want = load_hf(pre, rope_theta=1e6)(batch["input_ids"], labels=batch["labels"]).lm_loss
    assert first["step"] == 1 and abs(first["lm_loss"] - float(want)) < 1e-4 * float(want)


def test_midtrain_refuses_structural_change(tmp_path):
    import pytest

    from glmstack.config import ConfigError

    run(load_config("tiny", "pretrain", FAST + [f"out_dir={tmp_path}", "steps=1", "seq_len=16"]))
    cfg = load_config("tiny", "midtrain", FAST + [f"out_dir={tmp_path}", "steps=0", "model_overrides.hidden_size=32"])
    with pytest.raises(ConfigError, match="hidden_size"):
        run(cfg)
