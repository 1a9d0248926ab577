"""The whole build: byte-identical shards across runs and worker counts, resume, bad input, loaders on the output."""

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from glmstack.data.corpus import CorpusConfig, corpus_docs
from glmstack.data.loader import PackedLoader, PretrainLoader
from glmstack.data.pipeline import PipelineConfig, build_dataset
from glmstack.data.semdedup import SemDedupConfig
from glmstack.data.shards import TokenShards
from glmstack.data.sources import EmptyInputError, SourceConfig


@pytest.fixture(scope="module")
def tok():
    from glmstack.tokenizer import Tokenizer

    return Tokenizer.train((d.text for d in corpus_docs(CorpusConfig(size_mb=0.2))), 600)


def _cfg(**kw):
    base = {"corpus": CorpusConfig(size_mb=0.15), "unit_docs": 32, "progress": False}
    return PipelineConfig(**{**base, **kw})


def _digest(out: Path) -> dict:
    return {
        str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
        for split in ("train", "eval")
        for p in sorted((out / split).iterdir())
    }


def test_identical_across_runs_and_workers_and_resume(tmp_path, tok):
    one = build_dataset(_cfg(), tok, tmp_path / "a")
    build_dataset(_cfg(), tok, tmp_path / "b")
    build_dataset(_cfg(executor="processes", workers=2), tok, tmp_path / "c")
    ref = _digest(tmp_path / "a")
    assert ref == _digest(tmp_path / "b") == _digest(tmp_path / "c")
    assert one["splits"]["train"]["shards"][0]["tokens"] > 1000
    # execution settings are not part of the identity: a rerun with more workers finds the build done
    assert not (tmp_path / "a" / "work").exists()
    before = (tmp_path / "a" / "manifest.json").stat().st_mtime_ns
    build_dataset(_cfg(executor="processes", workers=2), tok, tmp_path / "a")
    assert (tmp_path / "a" / "manifest.json").stat().st_mtime_ns == before
    # an interrupted build (work files kept, some units not tokenized, no manifest) resumes to the same bytes
    build_dataset(_cfg(keep_work=True), tok, tmp_path / "d")
    work = tmp_path / "d" / "work"
    for p in list(work.glob("tok_0000[12].*")):
        p.unlink()
    (tmp_path / "d" / "manifest.json").unlink()
    shutil.rmtree(tmp_path / "d" / "train")
    build_dataset(_cfg(keep_work=True), tok, tmp_path / "d")
    assert _digest(tmp_path / "d") == ref


def test_summary_counts_and_loaders(tmp_path, tok):
    summary = build_dataset(_cfg(), tok, tmp_path)
    steps = {s: (a, b) for s, a, b in summary["steps"]}
    assert steps["read"][0] > 50 and steps["semdedup"][0] > steps["semdedup"][1]  # template pages removed
    mix = json.loads((tmp_path / "mixture.json").read_text())
    assert mix["epochs_by_level"] == [0.0, 0.5, 1.0, 2.0, 3.2]
    assert not any(k.startswith("train|docstrings|0") for k in mix["by_split_source_level"])  # bottom dropped
    batch = next(iter(PretrainLoader(tmp_path / "train", seq_len=64, batch_size=2)))
    assert batch["input_ids"].shape == (2, 64) and batch["input_ids"].max() < tok.vocab_size
    packed = next(iter(PackedLoader(tmp_path / "train", seq_len=128, batch_size=2)))
    assert set(packed) == {"input_ids", "labels", "position_ids", "segment_ids"}
    # FIM is the loader's job: the train split asks for it, its tokens hold no sentinel, the eval split asks none
    train = TokenShards(tmp_path / "train")
    assert train.meta["fim"]["rate"] == 0.5 and TokenShards(tmp_path / "eval").meta["fim"] is None
    sentinels = {tok.token_id(t) for t in ("<|code_prefix|>", "<|code_middle|>", "<|code_suffix|>")}
    assert not sentinels & set(np.unique(train.span(0, train.n_tokens)).tolist())
    assert PackedLoader(tmp_path / "train", seq_len=128, batch_size=2).fim is not None
    assert (tmp_path / "tokenizer" / "tokenizer.json").exists()


def test_bad_input_is_reported_and_the_run_continues(tmp_path, tok):
    path = tmp_path / "in.jsonl"
    good = [
        json.dumps({"text": f"Document number {i} talks about topic {i * 7} in plain English words."})
        for i in range(40)
    ]
    path.write_bytes(
        ("\n".join(good[:20]) + "\n{broken json\n").encode() + b'{"text": "bad \xff bytes here and'
        b' some more words to pass"}\n' + ("\n".join(good[20:]) + "\n").encode()
    )
    cfg = _cfg(sources=[SourceConfig(name="web", path=str(path))], semdedup=SemDedupConfig(enabled=False))
    summary = build_dataset(cfg, tok, tmp_path / "out")
    web = summary["sources"]["web"]
    assert web["n_errors"] == 1 and web["errors"][0].startswith(f"{path}:21: malformed JSON")
    assert web["utf8_replaced"] == 1 and web["docs"] == 41
    assert summary["splits"]["train"]["shards"]  # the good documents made it through


def test_empty_input_gives_a_clear_message(tmp_path, tok):
    (tmp_path / "empty.jsonl").write_text("")
    cfg = _cfg(sources=[SourceConfig(name="web", path=str(tmp_path / "empty.jsonl"))])
    with pytest.raises(EmptyInputError, match="no documents were read from: web"):
        build_dataset(cfg, tok, tmp_path / "out")
    from glmstack.data.cli import main

    assert (
        main([str(_write_cfg(tmp_path, cfg)), "--out", str(tmp_path / "o2"), "--tokenizer", str(_save(tok, tmp_path))])
        == 1
    )


def _write_cfg(tmp_path, cfg):
    from glmstack.config import write_json

    write_json(cfg, tmp_path / "cfg.json")
    return tmp_path / "cfg.json"


def _save(tok, tmp_path):
    tok.save(tmp_path / "tok")
    return tmp_path / "tok"


def test_datatrove_executor_gives_the_same_bytes(tmp_path, tok):
    """The cluster path (datatrove's LocalPipelineExecutor here; Slurm/Ray take the same step) matches in-process."""
    build_dataset(_cfg(), tok, tmp_path / "a")
    build_dataset(_cfg(executor="datatrove-local", workers=2), tok, tmp_path / "b")
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b")
