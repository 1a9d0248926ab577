"""SFT readers: OpenAI and ShareGPT records from JSONL, Parquet and folders; malformed records are skipped with
file:line and counted; a file without a valid record is one clear error."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from glmstack.config import ConfigError
from glmstack.posttrain.sft_data import read_conversations, write_jsonl

GOOD = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}


def test_malformed_records_are_skipped_with_file_line_and_reason(tmp_path):
    path = tmp_path / "mixed.jsonl"
    lines = [
        json.dumps(GOOD),
        "{not json",
        json.dumps({"messages": [{"role": "robot", "content": "x"}]}),
        json.dumps({"messages": [{"role": "user", "content": "only a question"}]}),
        json.dumps({"text": "  "}),
        json.dumps({"messages": [{"role": "user", "content": "q"},
                                 {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1"}}]}]}),
        json.dumps({"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}),
    ]  # fmt: skip
    path.write_text("\n".join(lines) + "\n")
    logged = []
    records, report = read_conversations(path, log=logged.append)
    assert len(records) == report.kept == 2
    assert [s.split(": ", 1)[0] for s in report.skipped] == [f"{path}:{i}" for i in (2, 3, 4, 5, 6)]
    assert "invalid JSON" in report.skipped[0] and "unknown role 'robot'" in report.skipped[1]
    assert "no trained assistant turn" in report.skipped[2] and "text must be a non-empty string" in report.skipped[3]
    assert "neither a mapping nor a JSON object" in report.skipped[4]
    assert len(logged) == 5 and "2 conversations from 1 files; 5 skipped" in report.summary()


def test_file_without_valid_record_is_an_error(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": []}\n')
    with pytest.raises(ConfigError, match=r"bad.jsonl: no valid conversation"):
        read_conversations(bad, log=None)
    with pytest.raises(ConfigError, match="no such file"):
        read_conversations(tmp_path / "missing.jsonl", log=None)


def test_folder_of_jsonl_and_parquet_with_train_false(tmp_path):
    write_jsonl([GOOD], tmp_path / "d" / "a.jsonl")
    turns = [{"role": "user", "content": "2+2?", "train": None}, {"role": "assistant", "content": "5", "train": False},
             {"role": "user", "content": "again", "train": None}, {"role": "assistant", "content": "4", "train": None}]  # fmt: skip
    pq.write_table(pa.Table.from_pylist([{"messages": turns, "enable_thinking": False}]), tmp_path / "d" / "b.parquet")
    records, report = read_conversations(tmp_path / "d", log=None)
    assert report.files == 2 and len(records) == 2
    assert [m.get("train", True) for m in records[1]["messages"]] == [True, False, True, True]
    assert records[1]["enable_thinking"] is False


def test_text_records_train_every_token_then_end_of_text(tmp_path):
    """{"text"} records (pre-training replay in an SFT mixture) sit beside conversations in one file: every token of
    the text is trained, then <|endoftext|> as in the pre-training shards; the conversation keeps its own mask."""
    from glmstack.posttrain.sft_data import encode_examples
    from glmstack.tokenizer import Tokenizer
    from tests.posttrain.base import make_base

    tok = Tokenizer.load(make_base(tmp_path / "base"))
    path = write_jsonl([GOOD, {"text": "def f(x):\n    return x + 1\n"}], tmp_path / "mix.jsonl")
    records, report = read_conversations(path, log=None)
    assert report.kept == 2 and records[1] == {"text": "def f(x):\n    return x + 1\n"}
    (ids, mask), = encode_examples(tok, records[1], "glm-4.5")
    assert ids == tok.encode("def f(x):\n    return x + 1\n") + [tok.token_id("<|endoftext|>")]
    assert mask == [1] * len(ids)
    (chat_ids, chat_mask), = encode_examples(tok, records[0], "glm-4.5")
    assert 0 < sum(chat_mask) < len(chat_ids)  # the conversation: the assistant's tokens only
