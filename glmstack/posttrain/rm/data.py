"""Preference pairs for reward-model training: files in two shapes, a synthetic checkable set, batches for the loop.

Records (JSONL, one object a line), normalised to (prompt messages, chosen messages, rejected messages):
  strings    {"prompt": "What is 2+2?", "chosen": "4", "rejected": "5"}
  messages   {"prompt": [{"role": "user", ...}, ...], "chosen": [{"role": "assistant", ...}], "rejected": [...]}
             or without "prompt": "chosen"/"rejected" are whole conversations sharing their prompt (TRL's
             conversational preference format); a chosen/rejected may also be one assistant message object.
A bad line is one ConfigError naming the file, the line and the field.

The synthetic sets (GLM-4.5 §3.4 trains RMs on preferences; here the preferred answer is checkable, so held-out
accuracy means something): "synthetic:<kind>" for one kind, "synthetic:checkable" = sort + json (arith is its own
set: a speedrun-size trunk cannot add, docs/rl.md). Each pair is a right and a wrong answer to one prompt
  sort   "Sort these numbers: 7 2 9 4" -> chosen "2 4 7 9", rejected: the same numbers with one adjacent pair
         swapped (a near miss) or in the given order
  arith  "What is 7 + 5?" -> chosen "The answer is 12.", rejected the same sentence off by 1-3
  json   "Call the calculator on 37 * 41." -> a valid `{"name": ..., "arguments": {...}}` call vs the same call with
         one syntax error (a missing brace or quote, a trailing comma, single quotes)
The split is a hash of the prompt (1 in 5 held out), so no held-out prompt is trained on.

Batches: each micro-batch is `micro_batch_size` pairs as `input_ids (2B, T)` (chosen rows then rejected rows, right
padded with the pad id to `seq_len`, so every micro-batch weighs the same in the loop), `segment_ids (2B, T)` (1 on
tokens, 0 on padding) and `last (2B,)` (each row's last token). Rank-aware and resumable (epoch, position).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch

from glmstack.config import ConfigError
from glmstack.splits import split_of

SYNTHETIC = "synthetic:"
KINDS = ("sort", "arith", "json")
CHECKABLE = ("sort", "json")  # what a small trunk can check; arith needs addition it does not have (docs/rl.md)


# ---------------------------------------------------------------------------------------------- records
def _messages(value, field: str, where: str, role: str = "assistant") -> list[dict]:
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    if isinstance(value, dict) and "role" in value:
        return [value]
    if isinstance(value, list) and value and all(isinstance(m, dict) and "role" in m for m in value):
        return value
    raise ConfigError(f"{where}: field {field!r} must be a string, a message or a list of messages")


def normalise(record: dict, where: str) -> tuple[list[dict], list[dict], list[dict]]:
    """One JSON record -> (prompt messages, chosen reply messages, rejected reply messages)."""
    if not isinstance(record, dict):
        raise ConfigError(f"{where}: a record must be a JSON object")
    for f in ("chosen", "rejected"):
        if f not in record:
            raise ConfigError(f"{where}: missing field {f!r}")
    chosen, rejected = _messages(record["chosen"], "chosen", where), _messages(record["rejected"], "rejected", where)
    if "prompt" in record:
        return _messages(record["prompt"], "prompt", where, role="user"), chosen, rejected
    n = 0  # conversational: the shared leading messages are the prompt
    while n < min(len(chosen), len(rejected)) - 1 and chosen[n] == rejected[n]:
        n += 1
    if n == 0:
        raise ConfigError(f"{where}: no 'prompt' and 'chosen'/'rejected' share no leading messages")
    return chosen[:n], chosen[n:], rejected[n:]


def read_pairs(path: Path, option: str = "rm.data") -> list[tuple[list[dict], list[dict], list[dict]]]:
    """Every record of a preference file (JSONL, or Parquet by its `.parquet` suffix: one row per record, the same
    fields, messages as lists of structs), normalised; `option` names the config field in a not-found error."""
    if not path.is_file():
        raise ConfigError(f"{option}: {path} not found")
    if path.suffix == ".parquet":
        return [normalise(_plain(record), f"{path}: row {i}") for i, record in enumerate(parquet_rows(path), start=1)]
    out = []
    for i, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}:{i}: not JSON ({e.msg})") from None
        out.append(normalise(record, f"{path}:{i}"))
    return out


def parquet_rows(path: Path) -> list[dict]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError(f"{path}: reading Parquet needs pyarrow (pip install 'glmstack[data]')") from None
    try:
        return pq.read_table(path).to_pylist()
    except (OSError, ValueError) as e:  # pyarrow.lib.ArrowInvalid is a ValueError, a bad file an OSError
        raise ConfigError(f"{path}: not a readable Parquet file ({type(e).__name__}: {e})") from None


def _plain(record: dict) -> dict:
    """A Parquet row as JSON would give it: struct fields that are null in this message (a union of message
    shapes across rows, e.g. tool_calls) are dropped."""
    def clean(v):
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items() if x is not None}
        if isinstance(v, list):
            return [clean(x) for x in v]
        return v

    return {k: clean(v) for k, v in record.items() if v is not None}


# ---------------------------------------------------------------------------------------------- synthetic


def sort_pair(rng: random.Random) -> tuple[str, str, str]:
    nums = [rng.randint(0, 99) for _ in range(rng.randint(3, 6))]
    good = sorted(nums)
    bad = list(good)
    i = rng.randrange(len(bad) - 1)
    if bad[i] == bad[i + 1] or rng.random() < 0.25:
        bad = nums if nums != good else good[::-1]
    else:
        bad[i], bad[i + 1] = bad[i + 1], bad[i]
    if bad == good:
        bad = good[1:] + good[:1]
    show = lambda xs: " ".join(map(str, xs))
    return f"Sort these numbers: {show(nums)}", show(good), show(bad)


def arith_pair(rng: random.Random) -> tuple[str, str, str]:
    a, b = rng.randint(1, 9), rng.randint(1, 9)
    wrong = a + b + rng.choice([-3, -2, -1, 1, 2, 3])
    return f"What is {a} + {b}?", f"The answer is {a + b}.", f"The answer is {wrong}."


def json_pair(rng: random.Random) -> tuple[str, str, str]:
    if rng.random() < 0.5:
        x, y = rng.randint(11, 99), rng.randint(11, 99)
        name, args, ask = "calculator", {"expression": f"{x} * {y}"}, f"Call the calculator on {x} * {y}."
    else:
        city = rng.choice(["Paris", "Rome", "Oslo", "Lima", "Cairo", "Tokyo", "Dublin", "Madrid"])
        name, args, ask = "get_weather", {"city": city}, f"Call get_weather for {city}."
    good = json.dumps({"name": name, "arguments": args})
    corrupt = rng.choice([lambda s: s[:-1], lambda s: s.replace('"', "", 1), lambda s: s[:-2] + ",}}",
                          lambda s: s.replace('"', "'"), lambda s: s.replace(":", "", 1)])  # fmt: skip
    return ask, good, corrupt(good)


PAIRS = {"sort": sort_pair, "arith": arith_pair, "json": json_pair}


def synthetic_pairs(name: str, n: int, seed: int, split: str) -> list[dict]:
    """`n` records of `split`, kinds in turn; `name` = "checkable" (all kinds) or one kind."""
    kinds = CHECKABLE if name == "checkable" else (name,)
    if any(k not in PAIRS for k in kinds):
        raise ConfigError(f"rm.data: unknown synthetic set {name!r} (checkable, {', '.join(KINDS)})")
    rng = random.Random(f"rm:{name}:{seed}")
    out, tries = [], 0
    while len(out) < n and tries < 100 * n + 1000:
        tries += 1
        kind = kinds[len(out) % len(kinds)]
        prompt, chosen, rejected = PAIRS[kind](rng)
        if split_of(prompt) == split and chosen != rejected:
            out.append({"prompt": prompt, "chosen": chosen, "rejected": rejected, "kind": kind})
    return out


def data_files(entries: list[str], out: Path, n: int, seed: int, split: str) -> list[Path]:
    """Paths for the entries; a synthetic set is written into `out` once (sft.data_files: the file is the record)."""
    from glmstack.posttrain.sft import data_files as written

    return written(entries, out, n, seed, split, generate=synthetic_pairs)


# ---------------------------------------------------------------------------------------------- encoding
def encode_pair(tokenizer, pair, style: str) -> tuple[list[int], list[int]]:
    """(chosen ids, rejected ids): prompt + reply rendered as one conversation in GLM's chat format."""
    from glmstack.chat import render

    prompt, chosen, rejected = pair
    enc = lambda reply: tokenizer.encode(render(prompt + reply, None, style=style, enable_thinking=False))
    return enc(chosen), enc(rejected)


def pad_rows(rows: list[list[int]], length: int, pad_id: int) -> dict:
    """Right-padded `input_ids`, `segment_ids` (0 = padding) and `last` (each row's last token)."""
    ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    seg = torch.zeros(len(rows), length, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        seg[i, : len(r)] = 1
    return {"input_ids": ids, "segment_ids": seg, "last": torch.tensor([len(r) - 1 for r in rows])}


class PreferenceBatches:
    """Micro-batches of pairs for the loop, reshuffled every epoch; `state_dict` = (epoch, position)."""

    def __init__(self, pairs: list[tuple[list[int], list[int]]], *, batch_size: int, seq_len: int, pad_id: int,
                 seed: int, rank: int = 0, world_size: int = 1, shuffle: bool = True):  # fmt: skip
        self.pairs = [p for p in pairs if max(len(p[0]), len(p[1])) <= seq_len]
        self.dropped_long = len(pairs) - len(self.pairs)
        if len(self.pairs) < batch_size * world_size:
            raise ValueError(f"{len(self.pairs)} pairs fit seq_len={seq_len}; a step needs {batch_size * world_size}")
        self.batch_size, self.seq_len, self.pad_id, self.seed = batch_size, seq_len, pad_id, seed
        self.rank, self.world, self.shuffle = rank, world_size, shuffle
        self.epoch, self.pos = 0, 0

    def order(self) -> list[int]:
        idx = list(range(len(self.pairs)))
        if self.shuffle:
            random.Random(f"{self.seed}:{self.epoch}").shuffle(idx)
        return idx

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        take = self.next_indices()
        chosen, rejected = [self.pairs[i][0] for i in take], [self.pairs[i][1] for i in take]
        return pad_rows(chosen + rejected, self.seq_len, self.pad_id)

    def next_indices(self) -> list[int]:
        """This rank's pair indices for the next micro-batch; advances the position (DPO's batches reuse it)."""
        per_step = self.batch_size * self.world
        if self.pos + per_step > len(self.pairs):
            self.epoch, self.pos = self.epoch + 1, 0
        take = self.order()[self.pos + self.rank * self.batch_size : self.pos + (self.rank + 1) * self.batch_size]
        self.pos += per_step
        return take

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.pos = int(state["epoch"]), int(state["pos"])
