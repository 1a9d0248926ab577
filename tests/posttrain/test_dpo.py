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
                "steps=8", "--set", "log.val_every=8", "--set", "dpo.reference=live", "--set", "log.plots=true")  # fmt: skip
    assert cli(argv) == 0
    stage = tmp_path / "tiny" / "dpo"
    first, last = rows(stage)[0], rows(stage)[-1]
    assert first["loss"] == math.log(2) or abs(first["loss"] - math.log(2)) < 1e-6  # step 0: policy = reference
    assert first["rewards/margins"] == 0 and first["logps/chosen"] < 0
    summary = json.loads((stage / "dpo_summary.json").read_text())
    assert last["val_loss"] < 0.6 and summary["heldout_reward_acc"] >= 0.75 and summary["heldout_pairs"] == 7
    assert (stage / "model" / "model.safetensors").exists() and (stage / "model" / "tokenizer.json").exists()
    assert all((stage / "plots" / f"{name}.png").exists() for name in ("dpo_rewards", "dpo_accuracy", "dpo_logps"))


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


def test_packed_pairs_score_as_padded_ones(base_dir, tok):
    """dpo.packing puts a micro-batch's sequences into fewer rows (segment and position ids restart per sequence):
    every sequence's completion log-prob, the DPO loss and its gradient equal the padded layout's."""
    from glmstack.model import load_hf
    from glmstack.posttrain.dpo.data import DPOBatches, encode_pair
    from glmstack.posttrain.dpo.stage import pair_terms
    from glmstack.posttrain.rm.data import normalise

    pairs = [encode_pair(tok, normalise(r, "t"), "glm-4.5") for r in synthetic_pairs("checkable", 12, 0, "train")]
    model = load_hf(str(base_dir))
    scores, grads, rows_used = [], [], []
    for packing in (False, True):
        data = DPOBatches(pairs, batch_size=6, seq_len=128, pad_id=0, seed=0, shuffle=False)
        data.packing = packing
        batch = data.batch_of(list(range(6)))
        model.zero_grad()
        logps, _, counts, _ = pair_terms(model, batch, reference=model)
        (logps.chunk(2)[0] - logps.chunk(2)[1]).sigmoid().log().mean().backward()
        scores.append((logps.detach(), counts))
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
        rows_used.append(batch["input_ids"].shape[0])
    assert rows_used[0] == 12 and rows_used[1] < 12  # packed: fewer rows for the same 12 sequences
    torch.testing.assert_close(scores[1][0], scores[0][0], atol=1e-5, rtol=1e-6)  # fp32 sums of ~100 nats
    assert torch.equal(scores[1][1], scores[0][1])  # the same completion tokens counted
    torch.testing.assert_close(grads[1], grads[0], atol=1e-5, rtol=1e-4)


def test_packed_run_trains_as_the_padded_run(base_dir, tmp_path):
    """Through the flag, 4 steps: the losses and rewards of a packed run follow the padded run's."""
    logged = {}
    for packing in ("false", "true"):
        out = tmp_path / packing
        assert cli(args(base_dir, out, "--set", "steps=4", "--set", "dpo.val_data=[]", "--set", "grad_accum=2",
                        "--set", f"dpo.packing={packing}", "--set", "seq_len=128")) == 0  # fmt: skip
        logged[packing] = rows(out / "tiny" / "dpo")
    for a, b in zip(logged["false"], logged["true"], strict=True):
        for k in ("loss", "rewards/margins", "logps/chosen"):
            # step 1 (same weights) agrees to fp32 rounding; after it the two runs' rounding compounds through the
            # updates (AVX-512 CPU: 2e-4 of 110 nats at step 2, 2.4e-3 of 156 at step 4)
            tol = 1e-5 if a["step"] == 1 else 1e-4 * (1 + abs(a[k]))
            assert abs(a[k] - b[k]) < tol, (k, a["step"], a[k], b[k])
    assert logged["true"][-1]["loss"] < logged["true"][0]["loss"]


def test_sft_weight_adds_the_chosen_replies_nll(base_dir, tmp_path):
    """dpo.sft_weight α (RPO): at step 0 (policy = reference) the loss is ln 2 + α · the logged chosen-token NLL."""
    assert cli(args(base_dir, tmp_path, "--set", "steps=2", "--set", "dpo.val_data=[]", "--set",
                    "dpo.sft_weight=0.5")) == 0  # fmt: skip
    first = rows(tmp_path / "tiny" / "dpo")[0]
    assert first["sft_nll"] > 1.0 and abs(first["loss"] - (math.log(2) + 0.5 * first["sft_nll"])) < 1e-5
