"""`glmstack dpo` end to end on a tiny model: it learns the training pairs (loss from ln 2 down, implicit-reward
accuracy up), a killed and resumed run equals an uninterrupted one bit for bit, and a bad preference file is one
line naming the file and record (exit code 2). The objective itself is checked against TRL in
tests/parity/test_dpo_trl.py."""

from __future__ import annotations

import json
import math

import torch
from safetensors.torch import load_file

from glmstack.cli import main as cli
from glmstack.posttrain.rm.data import synthetic_pairs
from glmstack.posttrain.sft_data import write_jsonl


def args(base_dir, out, *extra: str) -> list[str]:
    kv = {"init_from": base_dir, "out_dir": out, "micro_batch_size": 4, "dpo.synthetic_n": 40, "log.every": 1}
    return ["dpo", "dpo_tiny", *[a for k, v in kv.items() for a in ("--set", f"{k}={v}")], *extra]


def rows(stage) -> list[dict]:
    return [json.loads(line) for line in (stage / "metrics.jsonl").read_text().splitlines()]


def test_dpo_learns_the_training_pairs(base_dir, tmp_path):
    pairs = write_jsonl(synthetic_pairs("checkable", 8, seed=0, split="train"), tmp_path / "pairs.jsonl")
    data = f'["{pairs}"]'  # trained on and scored on (the 7 of 8 pairs that fit seq_len=64)
    argv = args(base_dir, tmp_path, "--set", f"dpo.data={data}", "--set", f"dpo.val_data={data}", "--set",
                "steps=8", "--set", "log.val_every=8", "--set", "dpo.reference=live")  # fmt: skip
    assert cli(argv) == 0
    stage = tmp_path / "tiny" / "dpo"
    first, last = rows(stage)[0], rows(stage)[-1]
    assert first["loss"] == math.log(2) or abs(first["loss"] - math.log(2)) < 1e-6  # step 0: policy = reference
    assert first["rewards/margins"] == 0 and first["logps/chosen"] < 0
    summary = json.loads((stage / "dpo_summary.json").read_text())
    assert last["val_loss"] < 0.6 and summary["heldout_reward_acc"] >= 0.75 and summary["heldout_pairs"] == 7
    assert (stage / "model" / "model.safetensors").exists() and (stage / "model" / "tokenizer.json").exists()


def test_dpo_resumes_bit_for_bit(base_dir, tmp_path, capsys):
    whole = args(base_dir, tmp_path / "a", "--set", "steps=4", "--set", "dpo.val_data=[]")
    assert cli(whole) == 0
    part = args(base_dir, tmp_path / "b", "--set", "steps=4", "--set", "dpo.val_data=[]")
    assert cli([*part, "--stop-at", "2"]) == 0  # killed at step 2 (a checkpoint), then a new run resumes
    capsys.readouterr()
    assert cli(part) == 0
    assert "(step 2)" in capsys.readouterr().out  # it resumed, and did not start over
    a = load_file(str(tmp_path / "a" / "tiny" / "dpo" / "model" / "model.safetensors"))
    b = load_file(str(tmp_path / "b" / "tiny" / "dpo" / "model" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ra, rb = rows(tmp_path / "a" / "tiny" / "dpo"), rows(tmp_path / "b" / "tiny" / "dpo")
    assert [r["loss"] for r in ra] == [r["loss"] for r in rb] and len(ra) == 4


def test_bad_preference_file_is_one_clear_line(base_dir, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "2+2?", "chosen": "4", "rejected": "5"}\n{"prompt": "3+3?", "chosen": "6"}\n')
    assert cli(args(base_dir, tmp_path, "--set", f'dpo.data=["{bad}"]')) == 2
    assert capsys.readouterr().err.strip() == f"glmstack dpo: {bad}:2: missing field 'rejected'"


def test_a_parquet_preference_file_trains_as_its_jsonl(base_dir, tmp_path, capsys):
    """The same pairs as JSONL and as Parquet: the same losses over 2 steps; a bad Parquet row is one clear line."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = synthetic_pairs("checkable", 8, seed=0, split="train")
    jsonl = write_jsonl(records, tmp_path / "pairs.jsonl")
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "pairs.parquet")
    losses = []
    for name, path in (("j", jsonl), ("p", tmp_path / "pairs.parquet")):
        assert cli(args(base_dir, tmp_path / name, "--set", f'dpo.data=["{path}"]', "--set", "dpo.val_data=[]",
                        "--set", "steps=2")) == 0  # fmt: skip
        losses.append([r["loss"] for r in rows(tmp_path / name / "tiny" / "dpo")])
    assert losses[0] == losses[1] and len(losses[0]) == 2
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": "a", "chosen": "b", "rejected": "c"}, {"prompt": "d", "chosen": "e"}]),
                   bad)  # fmt: skip
    capsys.readouterr()
    assert cli(args(base_dir, tmp_path / "bad", "--set", f'dpo.data=["{bad}"]')) == 2
    assert capsys.readouterr().err.strip() == f"glmstack dpo: {bad}: row 2: missing field 'rejected'"
