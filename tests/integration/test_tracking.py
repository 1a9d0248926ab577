"""Weights & Biases in offline mode logs exactly the scalars of metrics.jsonl, with no network (issue 27).

The offline run file (`<stage>/wandb/offline-run-*/run-*.wandb`) is read back here without wandb's service: it is
a LevelDB-style log (7-byte header ":W&B" 0xBEE1 version; 32 KiB blocks of records: crc32, length, type) of
protobuf `Record`s; each `history` record is one `wandb.log` call.
"""

import json
import math
from pathlib import Path

import pytest

from glmstack.recipes import load_config
from glmstack.train.stage import run

pytest.importorskip("wandb")
BLOCK = 32 * 1024


def _records(path: Path) -> list[bytes]:
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, buf, out = 7, b"", []
    while pos + 7 <= len(data):
        if BLOCK - pos % BLOCK < 7:  # a block's tail too short for a header is padding
            pos += BLOCK - pos % BLOCK
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        if kind == 0:
            break
        buf += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST: a record is complete
            out.append(buf)
            buf = b""
    return out


def _history_config_name(run_file: Path) -> tuple[dict[int, dict], dict, str]:
    from wandb.proto import wandb_internal_pb2 as pb

    rows, config, name = {}, {}, None
    for data in _records(run_file):
        rec = pb.Record()
        rec.ParseFromString(data)
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            row = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in rec.history.item}
            rows[int(row.pop("_step"))] = {k: v for k, v in row.items() if not k.startswith("_")}
        elif kind in ("run", "config"):  # the run record carries the initial config
            updates = rec.run.config.update if kind == "run" else rec.config.update
            name = rec.run.display_name if kind == "run" else name
            config |= {i.key: json.loads(i.value_json) for i in updates}
    return rows, config, name


def test_wandb_offline_holds_the_metrics_jsonl_scalars(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # nothing may reach a network
    overrides = ["seq_len=32", "micro_batch_size=2", "steps=3", "log.progress=false", "log.plots=false",
                 "log.val_every=0", "ckpt.every=0", "log.wandb=offline", f"out_dir={tmp_path}"]  # fmt: skip
    run(load_config("tiny", "pretrain", overrides))
    stage = tmp_path / "tiny" / "pretrain"
    rows = [json.loads(line) for line in (stage / "metrics.jsonl").read_text().splitlines()]
    want = {r["step"]: {k: v for k, v in r.items() if k != "step"} for r in rows}
    (run_file,) = stage.glob("wandb/offline-run-*/run-*.wandb")
    got, config, run_name = _history_config_name(run_file)
    assert sorted(got) == sorted(want) == [1, 2, 3]
    for step, row in want.items():
        assert got[step].keys() == row.keys(), (step, set(got[step]) ^ set(row))
        assert all(math.isclose(got[step][k], v, rel_tol=1e-12) for k, v in row.items()), (got[step], row)
    # the stage's TrainConfig travels with the run
    assert (
        run_name == "tiny/pretrain"
        and config["run"] == "tiny"
        and config["log"]["wandb"] == "offline"
        and config["seq_len"] == 32
    )
