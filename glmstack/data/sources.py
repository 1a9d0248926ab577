"""Document sources: JSONL (plain / .gz / .zst), Parquet, folders of text or code, HF `datasets` (objects or
folders written by save_to_disk).

Every source is a generator of `Doc`s so the pipeline streams with bounded memory: a file is read line by line
(JSONL) or record batch by record batch (Parquet), never loaded whole. Bad input never stops a run: a malformed
JSONL line is counted in `SourceStats.errors` with its `file:line`, invalid UTF-8 is decoded with replacement
characters and counted, and an empty input raises `EmptyInputError` with a message naming what was searched.
A truncated or corrupt .gz / .zst file stops the read with `CorruptSourceError` naming the file: the documents
after the cut are lost, and a build must not silently train on part of a file.

    for doc in read_source(SourceConfig(kind="jsonl", path="data/*.jsonl.zst", name="web"), stats):
        ...
"""

from __future__ import annotations

import glob
import gzip
import io
import json
import os
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from glmstack.data.doc import Doc

# extension -> language; a folder file outside this table is read as plain text (kind "text")
CODE_EXTENSIONS = {
    ".py": "python",
    ".pyi": "python",
    ".c": "c",
    ".h": "c",
    ".cc": "cpp",
    ".cpp": "cpp",
    ".hpp": "cpp",
    ".java": "java",
    ".js": "javascript",
    ".ts": "typescript",
    ".go": "go",
    ".rs": "rust",
    ".rb": "ruby",
    ".sh": "shell",
    ".cs": "csharp",
    ".kt": "kotlin",
    ".swift": "swift",
    ".php": "php",
    ".scala": "scala",
    ".lua": "lua",
    ".sql": "sql",
    ".r": "r",
    ".jl": "julia",
    ".m": "objc",
    ".pl": "perl",
}
TEXT_EXTENSIONS = {".txt", ".md", ".rst", ".tex", ""}


class EmptyInputError(ValueError):
    """A source matched no files or yielded no documents."""


class CorruptSourceError(ValueError):
    """A compressed source file is truncated or corrupt; the message names the file and the last good line."""


@dataclass(kw_only=True)
class SourceConfig:
    name: str  # label used in ids, the summary table and per-source quality percentiles
    kind: Literal["jsonl", "parquet", "folder", "hf", "corpus"] = "jsonl"
    # ^ reader: "hf" = a Hugging Face dataset saved with save_to_disk (needs `datasets`); "corpus" = built-in default
    path: str = ""  # file, glob, or folder; globs are sorted so the read order is fixed
    text_field: str = "text"  # record field holding the document text
    id_field: str = "id"  # record field holding a stable id (position is used when absent)
    doc_kind: str = "text"  # kind given to records that do not carry one: text | code | math | repo
    repo_level: bool = False  # folder only: one document per repository (files in import order) instead of per file


@dataclass
class SourceStats:
    docs: int = 0
    bytes: int = 0
    errors: list[str] = field(default_factory=list)  # "file:line: reason", the first 100 kept
    n_errors: int = 0
    utf8_replaced: int = 0  # documents whose bytes were not valid UTF-8

    def error(self, where: str, why: str) -> None:
        self.n_errors += 1
        if len(self.errors) < 100:
            self.errors.append(f"{where}: {why}")


def expand(path: str) -> list[str]:
    """Sorted list of files matching a path or glob (a folder expands to the files directly inside it)."""
    if os.path.isdir(path):
        return sorted(str(p) for p in Path(path).iterdir() if p.is_file())
    return (
        sorted(glob.glob(path, recursive=True))
        if any(c in path for c in "*?[")
        else ([path] if os.path.exists(path) else [])
    )


def open_binary(path: str) -> io.BufferedIOBase:
    """Open plain, gzip or zstandard files by extension, streaming (never the whole file in memory).
    A truncated gzip raises EOFError at its end; a truncated zstandard file does too (`_ZstdReader`)."""
    if path.endswith(".gz"):
        return gzip.open(path, "rb")
    if path.endswith((".zst", ".zstd")):
        return io.BufferedReader(_ZstdReader(open(path, "rb")), buffer_size=1 << 16)
    return open(path, "rb")


class _ZstdReader(io.RawIOBase):
    """Streaming zstandard decoding that notices a file ending inside a frame: zstandard's own stream_reader
    returns the partial data as if the file were whole. Concatenated frames (pzstd, appended files) are read on."""

    def __init__(self, raw: io.BufferedIOBase, chunk: int = 1 << 20):
        import zstandard

        self._raw, self._chunk, self._dctx = raw, chunk, zstandard.ZstdDecompressor()
        self._obj, self._fed = self._dctx.decompressobj(), False
        self._pending, self._pos = memoryview(b""), 0  # decoded bytes not yet handed out, from _pos on

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        while self._pos == len(self._pending):
            data = self._raw.read(self._chunk)
            if not data:
                if self._fed and not self._obj.eof:
                    raise EOFError("zstandard file ended inside a frame")
                return 0
            self._pending, self._pos = memoryview(self._feed(data)), 0
        n = min(len(buf), len(self._pending) - self._pos)
        buf[:n] = self._pending[self._pos : self._pos + n]
        self._pos += n
        return n

    def _feed(self, data: bytes) -> bytes:
        out = []
        while data:
            self._fed = True
            out.append(self._obj.decompress(data))
            data = self._obj.unused_data if self._obj.eof else b""
            if self._obj.eof:
                self._obj, self._fed = self._dctx.decompressobj(), False
        return b"".join(out)

    def close(self) -> None:
        self._raw.close()
        super().close()


def decode(raw: bytes, stats: SourceStats) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        stats.utf8_replaced += 1
        return raw.decode("utf-8", errors="replace")


def read_jsonl(cfg: SourceConfig, stats: SourceStats) -> Iterator[Doc]:
    files = expand(cfg.path)
    if not files:
        raise EmptyInputError(f"source {cfg.name!r}: no JSONL files match {cfg.path!r}")
    for path in files:
        yield from _read_jsonl_file(cfg, path, stats)


def _read_jsonl_file(cfg: SourceConfig, path: str, stats: SourceStats) -> Iterator[Doc]:
    lineno = 0
    try:
        with open_binary(path) as f:
            for lineno, raw in enumerate(f, 1):
                if not raw.strip():
                    continue
                doc = _record_to_doc(cfg, raw, f"{path}:{lineno}", stats)
                if doc is not None:
                    yield doc
    except (EOFError, OSError, zlib.error, _zstd_error()) as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise CorruptSourceError(
            f"{path}: truncated or corrupt after line {lineno} ({type(e).__name__}: {e}); "
            f"re-download the file or remove it from source {cfg.name!r}"
        ) from None


def _zstd_error() -> type[Exception]:
    import zstandard

    return zstandard.ZstdError


def _record_to_doc(cfg: SourceConfig, raw: bytes, where: str, stats: SourceStats) -> Doc | None:
    try:
        rec = json.loads(decode(raw, stats))
    except json.JSONDecodeError as e:
        stats.error(where, f"malformed JSON ({e.msg})")
        return None
    if not isinstance(rec, dict) or not isinstance(rec.get(cfg.text_field), str):
        stats.error(where, f"record has no string field {cfg.text_field!r}")
        return None
    return _make_doc(cfg, rec, where)


def _make_doc(cfg: SourceConfig, rec: dict, where: str) -> Doc:
    text = rec[cfg.text_field]
    rid = rec.get(cfg.id_field)
    doc_id = f"{cfg.name}/{rid}" if rid is not None else f"{cfg.name}/{os.path.basename(where)}"
    meta = {k: v for k, v in rec.items() if k not in (cfg.text_field, cfg.id_field) and _is_plain(v)}
    kind = rec.get("kind", cfg.doc_kind) if isinstance(rec.get("kind", cfg.doc_kind), str) else cfg.doc_kind
    return Doc(
        id=doc_id,
        text=text,
        source=cfg.name,
        kind=kind,
        lang=str(rec.get("lang", "")),
        path=str(rec.get("path", "")),
        meta=meta,
    )


def _is_plain(v: Any) -> bool:
    return isinstance(v, (str, int, float, bool)) or v is None


def read_parquet(cfg: SourceConfig, stats: SourceStats) -> Iterator[Doc]:
    import pyarrow.parquet as pq

    files = expand(cfg.path)
    if not files:
        raise EmptyInputError(f"source {cfg.name!r}: no Parquet files match {cfg.path!r}")
    for path in files:
        row = 0
        for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):  # bounded memory: one batch at a time
            for rec in batch.to_pylist():
                row += 1
                if not isinstance(rec.get(cfg.text_field), str):
                    stats.error(f"{path}:{row}", f"record has no string field {cfg.text_field!r}")
                    continue
                yield _make_doc(cfg, rec, f"{path}:{row}")


def read_folder(cfg: SourceConfig, stats: SourceStats) -> Iterator[Doc]:
    """A folder is one repository: files by extension become code or text documents (or one repo document)."""
    root = Path(cfg.path)
    if not root.is_dir():
        raise EmptyInputError(f"source {cfg.name!r}: {cfg.path!r} is not a folder")
    files = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts):
            ext = p.suffix.lower()
            if ext in CODE_EXTENSIONS or ext in TEXT_EXTENSIONS:
                files[str(p.relative_to(root))] = decode(p.read_bytes(), stats)
    if cfg.repo_level:
        from glmstack.data.repo import repo_document

        yield Doc(
            id=f"{cfg.name}/{root.name}",
            text=repo_document(root.name, files),
            source=cfg.name,
            kind="repo",
            lang="python",
            path=root.name,
        )
        return
    for rel, text in files.items():
        lang = CODE_EXTENSIONS.get(Path(rel).suffix.lower(), "")
        yield Doc(
            id=f"{cfg.name}/{rel}", text=text, source=cfg.name, kind="code" if lang else "text", lang=lang, path=rel
        )


def read_hf(dataset: Iterable[dict], cfg: SourceConfig) -> Iterator[Doc]:
    """Any iterable of dicts: a `datasets.Dataset` / `IterableDataset` (streaming) or a plain list."""
    for i, rec in enumerate(dataset):
        rec = dict(rec)
        rec.setdefault(cfg.id_field, i)
        yield _make_doc(cfg, rec, str(i))


def read_hf_disk(cfg: SourceConfig, stats: SourceStats) -> Iterator[Doc]:
    """A dataset folder written by `datasets.Dataset.save_to_disk` (memory-mapped Arrow, so streaming)."""
    try:
        import datasets
    except ImportError:
        raise EmptyInputError(f"source {cfg.name!r}: kind 'hf' needs the `datasets` package") from None
    if not os.path.isdir(cfg.path):
        raise EmptyInputError(f"source {cfg.name!r}: {cfg.path!r} is not a saved dataset folder")
    yield from read_hf(datasets.load_from_disk(cfg.path), cfg)


def read_source(cfg: SourceConfig, stats: SourceStats, corpus_cfg=None) -> Iterator[Doc]:
    """Dispatch on `cfg.kind`; counts documents and bytes into `stats`."""
    if cfg.kind == "corpus":
        from glmstack.data.corpus import CorpusConfig, corpus_docs

        docs: Iterable[Doc] = corpus_docs(corpus_cfg or CorpusConfig(), split="all")  # meta["split"] is set
    else:
        readers = {"jsonl": read_jsonl, "parquet": read_parquet, "folder": read_folder, "hf": read_hf_disk}
        docs = readers[cfg.kind](cfg, stats)
    for doc in docs:
        stats.docs += 1
        stats.bytes += len(doc.text.encode("utf-8", errors="replace"))
        yield doc
