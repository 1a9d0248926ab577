"""Bad input to the data pipeline ends in one line naming the file: a typed exception from the API, a non-zero
exit and no traceback from `glmstack data` (issue 13). The general bad-input cases live in their own file."""

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import zstandard

from glmstack.config import ConfigError
from glmstack.data.cli import load_recipe
from glmstack.data.sources import CorruptSourceError, SourceConfig, SourceStats, read_jsonl

ROOT = Path(__file__).resolve().parents[2]
RECORDS = "".join(json.dumps({"text": f"document {i} " + "word " * 40}) + "\n" for i in range(3000)).encode()


def _truncated(tmp_path: Path, ext: str) -> Path:
    whole = gzip.compress(RECORDS) if ext == "gz" else zstandard.ZstdCompressor().compress(RECORDS)
    path = tmp_path / f"web.jsonl.{ext}"
    path.write_bytes(whole[: len(whole) // 2])
    return path


def _recipe(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "recipe.json"
    path.write_text(text)
    return path


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "glmstack.cli", "data", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize("ext", ["gz", "zst"])
def test_truncated_compressed_source_names_the_file(tmp_path, ext):
    path = _truncated(tmp_path, ext)
    with pytest.raises(CorruptSourceError, match=rf"{path}: truncated or corrupt after line \d+"):
        list(read_jsonl(SourceConfig(name="web", path=str(path)), SourceStats()))


def test_whole_multi_frame_zst_source_reads_every_record(tmp_path):
    path = tmp_path / "web.jsonl.zst"  # two frames back to back, as pzstd or `cat a.zst b.zst` write them
    path.write_bytes(b"".join(zstandard.ZstdCompressor().compress(RECORDS) for _ in range(2)))
    assert len(list(read_jsonl(SourceConfig(name="web", path=str(path)), SourceStats()))) == 6000


@pytest.mark.parametrize(
    "text, says",
    [
        ('{"unit_docs": 64,\n "dedup": tru}', r"not valid JSON \(line 2 column"),
        ('{"unit_dcs": 64}', r"unit_dcs"),
    ],
)
def test_malformed_json_recipe_names_the_file(tmp_path, text, says):
    path = _recipe(tmp_path, text)
    with pytest.raises(ConfigError, match=rf"{path}: .*{says}"):
        load_recipe(str(path))


def test_cli_reports_each_case_in_one_line_without_a_traceback(tmp_path):
    gz = _truncated(tmp_path, "gz")
    sources = json.dumps({"sources": [{"name": "web", "path": str(gz)}], "progress": False})
    cases = {
        str(gz): _cli(str(_recipe(tmp_path, sources)), "--out", str(tmp_path / "out")),
        str(tmp_path / "recipe.json"): _cli(str(_recipe(tmp_path, "{not json")), "--print-config"),
    }
    for named, res in cases.items():
        assert res.returncode != 0
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
        assert lines[0].startswith("glmstack data: ") and named in lines[0]
