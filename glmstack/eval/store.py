"""Append-only results file: the evaluation resumes where a crash left it.

Each scored sample is one JSON line in `results.jsonl`, written and flushed as soon as it is scored, keyed by
(task, item id, sample index). A restarted run reads the file, skips every key already in it and appends the
rest; a line cut short by a crash is ignored (and scored again). Nothing is ever rewritten, so a kill at any
moment loses at most the samples in flight.

    store = ResultStore("runs/eval/results.jsonl")
    store.has("humaneval", "HumanEval/0", 0)
    store.append([{"task": "humaneval", "id": "HumanEval/0", "sample": 0, "passed": True, ...}])
    store.records("humaneval")
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path


class ResultStore:
    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._records: dict[tuple, dict] = {}
        self._lock = threading.Lock()
        self.torn_lines = 0  # lines a crash cut short
        if self.path.exists():
            self._read()

    def _read(self) -> None:
        text = self.path.read_text()
        for line in text.splitlines():
            try:
                rec = json.loads(line)
                self._records[_key(rec)] = rec
            except (json.JSONDecodeError, KeyError, TypeError):
                self.torn_lines += 1
        if text and not text.endswith("\n"):  # the next append must start on a fresh line
            with self.path.open("a") as f:
                f.write("\n")

    def has(self, task: str, item_id: str, sample: int) -> bool:
        return (task, item_id, sample) in self._records

    def append(self, records: list[dict]) -> None:
        with self._lock, self.path.open("a") as f:
            for rec in records:
                f.write(json.dumps(rec) + "\n")
                self._records[_key(rec)] = rec
            f.flush()
            os.fsync(f.fileno())

    def records(self, task: str) -> list[dict]:
        return [r for (t, _, _), r in self._records.items() if t == task]


def _key(rec: dict) -> tuple:
    return rec["task"], rec["id"], int(rec["sample"])
