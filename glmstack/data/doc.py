"""`Doc`: one document as every stage of the data pipeline sees it (read, filtered, deduplicated, tokenised).

Its own module because both the readers (sources.py) and the built-in corpus (corpus.py) make them, and the
readers also read the corpus: with the type in either of the two, they imported each other (issue 35).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Doc:
    id: str  # stable across runs: source name + position, or the record's own id
    text: str
    source: str  # the SourceConfig name; percentiles and the summary table are per source
    kind: str = "text"  # text | code | math | repo: decides FIM, code filters and SemDeDup
    lang: str = ""  # programming language for code ("python"), empty for prose
    path: str = ""  # file path inside its repo for code
    meta: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "id": self.id,
            "text": self.text,
            "source": self.source,
            "kind": self.kind,
            "lang": self.lang,
            "path": self.path,
            "meta": self.meta,
        }

    @classmethod
    def from_json(cls, d: dict) -> Doc:
        return cls(**d)
