"""`glmstack rm`: the Bradley–Terry loss by hand, the preference formats and synthetic set, and a tiny end-to-end run
on the one loop that writes a reward-model folder `load_rm` reads back (transformers parity: tests/parity/test_rm_hf.py)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from glmstack.cli import main as cli
from glmstack.config import ConfigError
from glmstack.posttrain.rm.data import normalise, read_pairs, synthetic_pairs
from glmstack.posttrain.rm.model import load_rm
from glmstack.posttrain.rm.stage import bradley_terry_loss


def test_bradley_terry_loss_hand_cases():
    r_c = torch.tensor([1.0, 0.0, -2.0], requires_grad=True)
    r_r = torch.tensor([0.0, 0.0, 1.0])
    loss, acc = bradley_terry_loss(r_c, r_r)
    sig = lambda x: 1 / (1 + math.exp(-x))
    expected = -(math.log(sig(1.0)) + math.log(0.5) + math.log(sig(-3.0))) / 3
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert acc.item() == pytest.approx(1 / 3)  # a tie is not a win
    loss.backward()  # d/dr_c of −log σ(d)/B = −(1 − σ(d))/B
    want = [-(1 - sig(d)) / 3 for d in (1.0, 0.0, -3.0)]
    torch.testing.assert_close(r_c.grad, torch.tensor(want))
    with_margin, _ = bradley_terry_loss(torch.tensor([2.0]), torch.tensor([0.0]), margin=1.0)
    assert with_margin.item() == pytest.approx(-math.log(sig(1.0)), abs=1e-6)
    swapped, _ = bradley_terry_loss(torch.tensor([0.0]), torch.tensor([5.0]))
    assert swapped.item() > 5.0  # confidently wrong costs about the margin


def test_preference_formats_normalise_the_same(tmp_path):
    user, good, bad = {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}, \
        {"role": "assistant", "content": "5"}
    records = [{"prompt": "2+2?", "chosen": "4", "rejected": "5"},
               {"prompt": [user], "chosen": [good], "rejected": bad},
               {"chosen": [user, good], "rejected": [user, bad]}]  # fmt: skip
    assert all(normalise(r, "x") == ([user], [good], [bad]) for r in records)
    path = tmp_path / "prefs.jsonl"
    path.write_text(json.dumps(records[0]) + "\n\n" + json.dumps({"prompt": "a", "chosen": 3, "rejected": "b"}) + "\n")
    with pytest.raises(ConfigError, match=r"prefs.jsonl:3: field 'chosen'"):
        read_pairs(path)
    path.write_text('{"prompt": "a", "chosen": "b"}\n')
    with pytest.raises(ConfigError, match=r"prefs.jsonl:1: missing field 'rejected'"):
        read_pairs(path)


def test_synthetic_pairs_are_checkable_and_split():
    train = synthetic_pairs("checkable", 60, seed=0, split="train") + synthetic_pairs("arith", 30, 0, "train")
    test = synthetic_pairs("checkable", 20, seed=0, split="test") + synthetic_pairs("arith", 10, 0, "test")
    assert {r["kind"] for r in train} == {"sort", "json", "arith"}
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in test}
    for r in train + test:
        if r["kind"] == "sort":
            nums = lambda s: [int(x) for x in s.split()]
            assert nums(r["chosen"]) == sorted(nums(r["chosen"])) != nums(r["rejected"])
            assert sorted(nums(r["rejected"])) == nums(r["chosen"])  # same numbers, wrong order
        elif r["kind"] == "arith":
            a, b = map(int, r["prompt"].removeprefix("What is ").rstrip("?").split(" + "))
            assert r["chosen"] == f"The answer is {a + b}." != r["rejected"]
        else:
            json.loads(r["chosen"])
            with pytest.raises(json.JSONDecodeError):
                json.loads(r["rejected"])


def test_rm_end_to_end_writes_a_reward_model(base_dir, tmp_path, capsys):
    args = ["rm", "rm_tiny", "--set", f"init_from={base_dir}", "--set", f"out_dir={tmp_path}", "--set", "steps=3",
            "--set", "rm.synthetic_n=40", "--set", "micro_batch_size=4", "--set", "log.val_every=3"]  # fmt: skip
    assert cli(args) == 0
    stage = tmp_path / "tiny" / "rm"
    summary = json.loads((stage / "rm_summary.json").read_text())
    assert summary["step"] == 3 and 0.0 <= summary["heldout_acc"] <= 1.0 and summary["heldout_pairs"] > 0
    assert set(summary["heldout_acc_by_kind"]) == {"sort", "json"}
    rows = [json.loads(line) for line in (stage / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and "accuracy" in rows[0] and "val_loss" in rows[-1]
    rm = load_rm(stage / "model")
    config = json.loads((stage / "model" / "config.json").read_text())
    assert config["architectures"] == ["Glm4MoeForSequenceClassification"] and config["num_nextn_predict_layers"] == 0
    assert rm(torch.tensor([[5, 6, 7]]), torch.tensor([2]))[0].shape == (1,)


def test_rm_bad_input_is_one_line(base_dir, tmp_path, capsys):
    args = ["rm", "rm_tiny", "--set", f"init_from={base_dir}", "--set", f"out_dir={tmp_path}",
            "--set", f"rm.data=[\"{tmp_path / 'missing.jsonl'}\"]"]  # fmt: skip
    assert cli(args) == 2
    err = capsys.readouterr().err.strip()
    assert "missing.jsonl not found" in err and len(err.splitlines()) == 1


def test_parquet_preference_files_read_as_their_jsonl(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    user = {"role": "user", "content": "2+2?"}
    conv = [{"chosen": [user, {"role": "assistant", "content": "4"}],
             "rejected": [user, {"role": "assistant", "content": "5"}]},
            {"chosen": [{"role": "system", "content": "be brief"}, user, {"role": "assistant", "content": "four"}],
             "rejected": [{"role": "system", "content": "be brief"}, user, {"role": "assistant", "content": "5"}]}]
    flat = [{"prompt": "a?", "chosen": "b", "rejected": "c"}, {"prompt": "d?", "chosen": "e", "rejected": "f"}]
    for name, records in (("conv", conv), ("flat", flat)):
        pq.write_table(pa.Table.from_pylist(records), tmp_path / f"{name}.parquet")
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        assert read_pairs(tmp_path / f"{name}.parquet") == read_pairs(tmp_path / f"{name}.jsonl")
    pq.write_table(pa.Table.from_pylist([{"prompt": "a", "chosen": "b"}]), tmp_path / "bad.parquet")
    with pytest.raises(ConfigError, match=r"bad.parquet: row 1: missing field 'rejected'"):
        read_pairs(tmp_path / "bad.parquet")
    (tmp_path / "junk.parquet").write_bytes(b"not parquet")
    with pytest.raises(ConfigError, match=r"junk.parquet: not a readable Parquet file"):
        read_pairs(tmp_path / "junk.parquet")


def test_rm_with_lora_trains_adapters_and_the_head_and_exports_both(base_dir, tmp_path):
    """`glmstack rm --set lora.enabled=true`: the trunk stays the base's, the adapters and the score head train; the
    stage writes the merged reward model (what `rm:` scorers read) and a PEFT adapter folder (SEQ_CLS, the head in
    modules_to_save) that transformers + PEFT score exactly as the merged model does."""
    from peft import PeftModel
    from safetensors.torch import load_file

    from glmstack.model import load_hf
    from tests.parity.test_rm_hf import hf_classifier_cls

    args = ["rm", "rm_tiny", "--set", f"init_from={base_dir}", "--set", f"out_dir={tmp_path}", "--set", "steps=4",
            "--set", "rm.synthetic_n=40", "--set", "micro_batch_size=4", "--set", "lora.enabled=true", "--set",
            "lora.r=4", "--set", "optim.muon=false", "--set", "optim.lr=1e-2"]  # fmt: skip
    assert cli(args) == 0
    stage = tmp_path / "tiny" / "rm"
    rm = load_rm(stage / "model")
    config = json.loads((stage / "adapter" / "adapter_config.json").read_text())
    assert config["task_type"] == "SEQ_CLS" and config["modules_to_save"] == ["score"]
    assert config["base_model_name_or_path"] == str(base_dir.resolve())
    adapter = load_file(str(stage / "adapter" / "adapter_model.safetensors"))
    assert any(".lora_B." in k and v.abs().max() > 0 for k, v in adapter.items())  # the adapters trained
    base = load_hf(base_dir)
    merged_emb = rm.model.embed_tokens.weight
    torch.testing.assert_close(merged_emb, base.embed_tokens.weight, atol=0, rtol=0)  # not adapted: untouched
    pad = json.loads((stage / "model" / "config.json").read_text())["pad_token_id"]
    ids = torch.randint(pad + 1, rm.cfg.vocab_size, (3, 10), generator=torch.Generator().manual_seed(0))
    seq_cls = hf_classifier_cls().from_pretrained(str(base_dir), num_labels=1, pad_token_id=pad)  # the base as an RM
    hf = PeftModel.from_pretrained(seq_cls, str(stage / "adapter")).eval()
    with torch.no_grad():
        ours = rm(ids, torch.full((3,), 9))[0]
        theirs = hf(ids).logits.squeeze(-1)
    torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=1e-4)
    with pytest.raises(ConfigError, match="no QLoRA"):
        from glmstack.posttrain.rm.stage import check
        from glmstack.recipes import load_config

        check(load_config("rm_tiny", "rm", ["lora.enabled=true", "lora.base_quant=int4"]))
