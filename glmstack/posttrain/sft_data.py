"""SFT conversation files -> validated records, and records -> token ids + loss masks.

What: `read_conversations(paths) -> (records, ReadReport)` reads JSONL files, Parquet files, or folders of either
(sorted, recursively), in two record shapes:
  OpenAI:   {"messages": [...], "tools": [...]?, "enable_thinking": bool?, "clear_thinking": bool?,
             "thinking_mode": "interleaved" | "preserved" | "turn"?}
            assistant turns may carry `reasoning_content` and `tool_calls` (arguments a JSON string or an object);
            `{"role": "tool"}` messages carry results; `"train": false` on an assistant turn keeps it in context
            without training on it (GLM-5's masked error segments, research/post-training-recipe.md §2).
  ShareGPT: {"conversations": [{"from": "system|human|gpt|observation|...", "value": ...}], "tools": ...?}
  text:     {"text": "..."}: plain text trained on every token, then `<|endoftext|>` (pre-training replay in the SFT
            mixture: the speedrun keeps some of the base model's knowledge this way, docs/speedrun.md)
A malformed record is skipped with `file:line` and the reason, and counted; a file without one valid record is
an error (ConfigError, one line). Validation is the chat renderer's own (glmstack.chat.schema.check_messages) plus
"has at least one trained assistant turn", so every kept record encodes.

`encode_record(tokenizer, record, style)` -> (ids, mask) via glmstack.chat.encode: the mask marks exactly the
assistant's own tokens (reasoning, `</think>`, content, tool calls) and the token that ends its turn.
`encode_examples(tokenizer, record, style, mode)` -> [(ids, mask)]: the record laid out in one of GLM-5's thinking
modes (glmstack.chat.modes: one example per user turn, or the whole conversation with its reasoning preserved);
the record's own `thinking_mode` wins over `mode`, and neither gives encode_record's one example.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from glmstack.atomic import write_atomic
from glmstack.chat import encode
from glmstack.chat.modes import MODES, encode_mode
from glmstack.chat.schema import check_messages, trains
from glmstack.config import ConfigError

SUFFIXES = (".jsonl", ".parquet")
SHAREGPT_ROLES = {
    "system": "system", "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
    "observation": "tool", "tool": "tool", "function_response": "tool",
}  # fmt: skip
RECORD_OPTIONS = ("enable_thinking", "clear_thinking")  # per-record template switches


@dataclass
class ReadReport:
    """What reading kept and skipped; `skipped` lines are "file:line: reason"."""

    files: int = 0
    kept: int = 0
    skipped: list[str] = field(default_factory=list)
    reasons: Counter = field(default_factory=Counter)

    def summary(self) -> str:
        why = ", ".join(f"{n} {r}" for r, n in self.reasons.most_common())
        return f"{self.kept} conversations from {self.files} files; {len(self.skipped)} skipped" + (
            f" ({why})" if why else ""
        )


class MalformedRecord(ValueError):
    """A record that cannot be trained on; the message is the reason."""


def files_of(paths) -> list[Path]:
    """Every JSONL/Parquet file named, or inside a named folder (sorted); a missing path is a ConfigError."""
    out: list[Path] = []
    for p in [paths] if isinstance(paths, (str, Path)) else paths:
        p = Path(p)
        if p.is_dir():
            found = sorted(f for f in p.rglob("*") if f.suffix in SUFFIXES and f.is_file())
            if not found:
                raise ConfigError(f"{p}: folder holds no {' or '.join(SUFFIXES)} files")
            out += found
        elif p.is_file():
            if p.suffix not in SUFFIXES:
                raise ConfigError(f"{p}: unsupported file type (expected {' or '.join(SUFFIXES)})")
            out.append(p)
        else:
            raise ConfigError(f"{p}: no such file or folder")
    return out


def raw_rows(path: Path):
    """(line number, raw record or a MalformedRecord) per row; Parquet rows count from 1 like lines."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        for i, row in enumerate(pq.read_table(path).to_pylist(), 1):
            yield i, row
        return
    with path.open(encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield i, json.loads(line)
            except ValueError as e:
                yield i, MalformedRecord(f"invalid JSON ({e.msg})")


def normalize(raw) -> dict:
    """One record in the OpenAI shape {"messages", "tools", options...}; raises MalformedRecord."""
    if isinstance(raw, MalformedRecord):
        raise raw
    if not isinstance(raw, dict):
        raise MalformedRecord(f"a record must be a JSON object, got {type(raw).__name__}")
    if "text" in raw and "messages" not in raw and "conversations" not in raw:
        if not isinstance(raw["text"], str) or not raw["text"].strip():
            raise MalformedRecord("text must be a non-empty string")
        return {"text": raw["text"]}
    if "messages" in raw:
        messages = raw["messages"]
    elif "conversations" in raw:
        messages = _from_sharegpt(raw["conversations"])
    else:
        raise MalformedRecord("no 'messages' (OpenAI), 'conversations' (ShareGPT) or 'text' field")
    if not isinstance(messages, list) or not messages:
        raise MalformedRecord("messages must be a non-empty list")
    messages = [_drop_nulls(m) for m in messages]
    tools = raw.get("tools") or None
    if isinstance(tools, str):  # ShareGPT sets often store the tool list as a JSON string
        tools = _json_field(tools, "tools")
    if tools is not None and not isinstance(tools, list):
        raise MalformedRecord("tools must be a list")
    try:
        check_messages(messages)
    except ValueError as e:
        raise MalformedRecord(str(e)) from None
    if not any(m["role"] == "assistant" and trains(m) for m in messages):
        raise MalformedRecord("no trained assistant turn")
    record = {"messages": messages, "tools": tools}
    for key in RECORD_OPTIONS:
        if raw.get(key) is not None:
            if not isinstance(raw[key], bool):
                raise MalformedRecord(f"{key} must be true or false")
            record[key] = raw[key]
    if raw.get("thinking_mode"):
        if raw["thinking_mode"] not in MODES:
            raise MalformedRecord(f"thinking_mode must be one of {', '.join(MODES)}")
        record["thinking_mode"] = raw["thinking_mode"]
    return record


def _drop_nulls(m):
    """Parquet fills absent struct fields with None; a None `train` or `tool_calls` means 'not given'."""
    return {k: v for k, v in m.items() if v is not None or k == "content"} if isinstance(m, dict) else m


def _json_field(text: str, name: str):
    try:
        return json.loads(text)
    except ValueError:
        raise MalformedRecord(f"{name} is a string but not JSON") from None


def _from_sharegpt(turns) -> list[dict]:
    if not isinstance(turns, list):
        raise MalformedRecord("conversations must be a list")
    out = []
    for i, t in enumerate(turns):
        if not isinstance(t, dict) or "from" not in t or "value" not in t:
            raise MalformedRecord(f"conversations[{i}]: needs 'from' and 'value'")
        role = SHAREGPT_ROLES.get(t["from"])
        if role is None:
            raise MalformedRecord(f"conversations[{i}]: unknown speaker {t['from']!r}")
        m = {"role": role, "content": t["value"]}
        if t.get("train") is not None:
            m["train"] = t["train"]
        out.append(m)
    return out


def read_conversations(paths, *, log=print) -> tuple[list[dict], ReadReport]:
    """Valid records of every file (see module docstring); skipped ones are logged as `file:line: reason`."""
    report, records = ReadReport(), []
    for path in files_of(paths):
        report.files += 1
        kept_here = 0
        for line, raw in raw_rows(path):
            try:
                records.append(normalize(raw))
                kept_here += 1
            except MalformedRecord as e:
                report.skipped.append(f"{path}:{line}: {e}")
                report.reasons[_kind(str(e))] += 1
                if log is not None:
                    log(f"skipped {path}:{line}: {e}")
        if kept_here == 0:
            raise ConfigError(f"{path}: no valid conversation in the file ({len(report.skipped)} skipped so far)")
        report.kept += kept_here
    return records, report


def _kind(reason: str) -> str:
    """A reason without its positions and details, for the summary's counts."""
    return re.sub(r"^(message|conversations\[)\s*\d+\]?: ", "", reason).split(" (")[0].split(": ")[0][:60]


def encode_record(tokenizer, record: dict, style: str) -> tuple[list[int], list[int]]:
    """(ids, loss mask) of one normalized record in `style`, with its own thinking switches."""
    opts = {k: record[k] for k in RECORD_OPTIONS if k in record}
    return encode(tokenizer, record["messages"], record.get("tools"), style=style, **opts)


def encode_examples(tokenizer, record: dict, style: str, mode: str = "") -> list[tuple[list[int], list[int]]]:
    """The record's examples in its `thinking_mode`, else `mode` ("" = encode_record's one example). ValueError
    for preserved thinking in the glm-4.5 style (its template cannot keep earlier reasoning)."""
    if "text" in record:  # pre-training replay: every token a target, the document's end marked as in the shards
        ids = tokenizer.encode(record["text"]) + [tokenizer.token_id("<|endoftext|>")]
        return [(ids, [1] * len(ids))]
    mode = record.get("thinking_mode") or mode
    if not mode:
        return [encode_record(tokenizer, record, style)]
    return encode_mode(tokenizer, record["messages"], record.get("tools"), style, mode,
                       record.get("enable_thinking", True))  # fmt: skip


def write_jsonl(records, path: str | Path) -> Path:
    """Records as JSONL (atomic: written to a temporary name, then renamed)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)

    def write(tmp: Path) -> None:
        with tmp.open("w", encoding="utf-8") as f:
            for r in records:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")

    return write_atomic(path, write)
