"""Sources: JSONL (plain/gz/zst), Parquet, folders, iterables; bad input is counted with file:line, never fatal."""

import gzip
import json

import pytest

from glmstack.data.sources import EmptyInputError, SourceConfig, SourceStats, read_hf, read_source


def _write(path, lines: list[bytes]):
    raw = b"\n".join(lines) + b"\n"
    if str(path).endswith(".gz"):
        raw = gzip.compress(raw)
    elif str(path).endswith(".zst"):
        import zstandard

        raw = zstandard.ZstdCompressor().compress(raw)
    path.write_bytes(raw)


@pytest.mark.parametrize("ext", ["jsonl", "jsonl.gz", "jsonl.zst"])
def test_jsonl_compressions(tmp_path, ext):
    _write(tmp_path / f"a.{ext}", [json.dumps({"id": i, "text": f"doc {i}"}).encode() for i in range(3)])
    stats = SourceStats()
    docs = list(read_source(SourceConfig(name="s", path=str(tmp_path / f"*.{ext}")), stats))
    assert [d.text for d in docs] == ["doc 0", "doc 1", "doc 2"]
    assert [d.id for d in docs] == ["s/0", "s/1", "s/2"] and stats.docs == 3


def test_malformed_line_is_reported_with_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    _write(path, [b'{"text": "good one"}', b'{"text": broken', b'{"no_text": 1}', b'{"text": "good two"}'])
    stats = SourceStats()
    docs = list(read_source(SourceConfig(name="s", path=str(path)), stats))
    assert [d.text for d in docs] == ["good one", "good two"]  # the run continues past bad lines
    assert stats.n_errors == 2
    assert stats.errors[0].startswith(f"{path}:2: malformed JSON")
    assert stats.errors[1].startswith(f"{path}:3: record has no string field")


def test_invalid_utf8_is_replaced_and_counted(tmp_path):
    path = tmp_path / "u.jsonl"
    _write(path, [b'{"text": "caf\xe9 ok"}'])
    stats = SourceStats()
    (doc,) = read_source(SourceConfig(name="s", path=str(path)), stats)
    assert doc.text == "caf\ufffd ok" and stats.utf8_replaced == 1


def test_empty_input_raises_a_clear_message(tmp_path):
    with pytest.raises(EmptyInputError, match="no JSONL files match"):
        list(read_source(SourceConfig(name="s", path=str(tmp_path / "*.jsonl")), SourceStats()))


def test_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["a b c", "d e f"], "id": ["x", "y"]}), tmp_path / "t.parquet")
    docs = list(read_source(SourceConfig(name="p", kind="parquet", path=str(tmp_path / "t.parquet")), SourceStats()))
    assert [(d.id, d.text) for d in docs] == [("p/x", "a b c"), ("p/y", "d e f")]


def test_folder_is_a_repo(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("from . import b\n")
    (tmp_path / "pkg" / "b.py").write_text("X = 1\n")
    (tmp_path / "README.md").write_text("hello")
    files = list(read_source(SourceConfig(name="r", kind="folder", path=str(tmp_path)), SourceStats()))
    kinds = {d.path: (d.kind, d.lang) for d in files}
    assert kinds == {"README.md": ("text", ""), "pkg/__init__.py": ("code", "python"), "pkg/b.py": ("code", "python")}
    (repo,) = read_source(SourceConfig(name="r", kind="folder", path=str(tmp_path), repo_level=True), SourceStats())
    assert repo.kind == "repo" and repo.text.index("pkg/b.py") < repo.text.index("pkg/__init__.py")


def test_iterable_of_dicts_like_hf_datasets():
    docs = list(read_hf([{"text": "one"}, {"text": "two", "id": "z"}], SourceConfig(name="hf")))
    assert [d.id for d in docs] == ["hf/0", "hf/z"]
