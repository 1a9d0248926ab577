"""`glmstack sft` on each of GLM-5's thinking modes (`sft.thinking_mode`, glmstack.chat.modes): the synthetic sets
are written in the mode, laid out as the mode's examples, and a tiny model trains on them for 2 steps."""

import json
import math

import pytest

from glmstack.posttrain import sft
from glmstack.posttrain.sft_data import read_conversations
from glmstack.recipes import load_config
from glmstack.tokenizer import Tokenizer

pytestmark = pytest.mark.slow  # three 2-step runs of the tiny model (~10 s each on the loaded 2-core machine)


def overrides(base_dir, out, mode, style="glm-4.7"):
    sets = json.dumps(["synthetic:chat", "synthetic:tools"])
    kv = {"init_from": str(base_dir), "out_dir": str(out), "steps": 2, "seq_len": 256, "micro_batch_size": 2,
          "sft.data": sets, "sft.val_data": "[]", "sft.synthetic_n": 16, "sft.chat_style": style,
          "sft.thinking_mode": mode, "ckpt.every": 2, "log.every": 1, "log.val_every": 0, "log.progress": False,
          "schedule.warmup_steps": 1}  # fmt: skip
    return [f"{k}={v}" for k, v in kv.items()]


@pytest.mark.parametrize("mode", ["interleaved", "preserved", "turn"])
def test_sft_trains_on_each_thinking_mode(base_dir, tmp_path, mode):
    cfg = load_config("sft_speedrun", "sft", overrides(base_dir, tmp_path, mode))
    result = sft.run_sft(cfg)
    stage = tmp_path / "speedrun" / "sft"
    assert result["stopped"] == "done" and (stage / "model" / "model.safetensors").exists()
    rows = [json.loads(x) for x in (stage / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]
    assert [r["step"] for r in rows][-2:] == [1, 2] and all(math.isfinite(r["loss"]) for r in rows)
    assert all(0 < r["trained_frac"] < 1 for r in rows)

    # the data: written in the mode, one example per user turn except when reasoning is preserved
    files = sorted(p.name for p in (stage / "data").glob("*.jsonl"))
    assert files == [f"chat.{mode}.train.jsonl", f"tools.{mode}.train.jsonl"]
    records, _ = read_conversations(sorted((stage / "data").glob("*.jsonl")), log=None)
    assert all(r["thinking_mode"] == mode for r in records)
    n_turns = sum(sum(m["role"] == "user" for m in r["messages"]) for r in records)
    examples = sft.encoded(cfg, Tokenizer.load(base_dir), "train")
    assert len(examples) == (len(records) if mode == "preserved" else n_turns) and n_turns > len(records)


def test_preserved_thinking_in_the_glm45_style_is_one_clear_line(base_dir, tmp_path, capsys):
    argv = ["sft_speedrun", *[a for kv in overrides(base_dir, tmp_path, "preserved", "glm-4.5") for a in ("--set", kv)]]
    assert sft.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("glmstack sft: sft.thinking_mode: preserved thinking needs the glm-4.7 template")
