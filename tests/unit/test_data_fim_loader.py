"""FIM at sampling time (fim.ContextFIM through the loaders): only code is transformed, in the documented token
order; every epoch and every up-sampled copy sees its own cut, the same in every run; resume stays exact."""

import numpy as np
import pytest

from glmstack.data.fim import MID, PRE, SUF, FIMConfig, choose, doc_key, fim_split, format_fim
from glmstack.data.loader import PackedLoader, PretrainLoader
from glmstack.data.shards import ShardWriter, TokenShards

CODE = [f"def f{i}(a, b):\n    total = a * {i} + b\n    return total - {i * 3}\n" for i in range(6)]
PROSE = [f"The fox number {i} jumps over the lazy dog and runs into the forest again." for i in range(4)]


@pytest.fixture(scope="module")
def tok():
    from glmstack.tokenizer import Tokenizer

    return Tokenizer.train(CODE * 20 + PROSE * 20, 400)


def _build(folder, tok, fim: FIMConfig | None):
    """train/ with each code document twice (copies 0 and 1, as the mixture up-samples) and prose once,
    tokenizer/ beside it, as `glmstack data` writes them."""
    eos = tok.token_id("<|endoftext|>")
    w = ShardWriter(folder / "train", 200, eos, tok.vocab_size)
    docs = [(t, f"code/{i}", c, "code") for c in (0, 1) for i, t in enumerate(CODE)]
    docs += [(t, f"prose/{i}", 0, "text") for i, t in enumerate(PROSE)]
    for text, doc_id, copy, kind in docs:
        w.add(tok.encode(text) + [eos], (doc_key(doc_id), copy, kind))
    w.close(fim=vars(fim) if fim else None)
    tok.save(folder / "tokenizer")
    return folder / "train"


def _chunks(loader, epoch) -> dict[tuple[int, int], np.ndarray]:
    """(key, copy) -> the tokens the loader feeds for that document in `epoch` (rows hold whole documents)."""
    out = {}
    for i, row in enumerate(loader.rows):
        ids = loader.row(i, epoch)["input_ids"]
        t = 0
        for doc, _, n in row:
            key, copy, _ = loader.shards.docs[doc]
            whole = loader.fim.fragment(doc, 0, loader.shards.doc(doc), epoch)[: n + int(loader.fim.room[doc])]
            out[int(key), int(copy)] = ids[t : t + len(whole)]
            t += len(whole)
    return out


def test_only_code_is_transformed_in_the_documented_order(tmp_path, tok):
    cfg = FIMConfig(rate=1.0, spm_rate=0.5, seed=3)
    train = _build(tmp_path, tok, cfg)
    sentinels = {tok.token_id(t) for t in (PRE, SUF, MID)}
    shards = TokenShards(train)
    assert not sentinels & set(shards.span(0, shards.n_tokens).tolist())  # the shards themselves stay plain
    loader = PackedLoader(train, seq_len=4096, batch_size=1, shuffle=False)
    modes = set()
    for epoch in (0, 1):
        for d in range(shards.n_docs):
            key, copy, kind = shards.docs[d]
            out = loader.fim.fragment(d, 0, shards.doc(d), epoch)
            assert out[-1] == shards.eos_id
            text = tok.decode(shards.doc(d)[:-1].tolist())
            if kind != 1:  # prose: untouched
                assert out.tolist() == shards.doc(d).tolist()
                continue
            mode, rng = choose((int(key), int(copy), epoch, 0), cfg)
            assert tok.decode(out[:-1].tolist()) == format_fim(*fim_split(text, rng), mode=mode)
            modes.add(mode)
    assert modes == {"psm", "spm_v2"}
    plain = PackedLoader(train, seq_len=4096, batch_size=1, shuffle=False, fim=False)
    assert not sentinels & set(plain.row(0)["input_ids"].tolist())


def test_cuts_differ_across_epochs_and_copies_but_not_across_runs(tmp_path, tok):
    train = _build(tmp_path, tok, FIMConfig(rate=1.0))
    first, again = (PackedLoader(train, seq_len=4096, batch_size=1, shuffle=False) for _ in range(2))
    e0, e1 = _chunks(first, 0), _chunks(first, 1)
    code = [k for k in e0 if k[1] == 0 and (k[0], 1) in e0]
    assert len(code) == len(CODE)
    for key, _ in code:
        assert e0[key, 0].tolist() != e0[key, 1].tolist()  # copies of one document: different cuts
        assert e0[key, 0].tolist() != e1[key, 0].tolist()  # epochs: different cuts
    assert {k: v.tolist() for k, v in _chunks(again, 1).items()} == {k: v.tolist() for k, v in e1.items()}
    # best-fit keeps ROOM tokens beside each code chunk: a document that grew by no more arrives whole
    whole_docs = 0
    for i, row in enumerate(first.rows):
        ids, t = first.row(i, 1)["input_ids"], 0
        for doc, start, n in row:
            whole = first.fim.fragment(doc, start, first.shards.doc(doc), 1)
            got = whole[: n + int(first.fim.room[doc])]
            assert ids[t : t + len(got)].tolist() == got.tolist()
            whole_docs += len(got) == len(whole)
            t += len(got)
    assert whole_docs >= first.shards.n_docs - 1


@pytest.mark.parametrize("kind", ["pretrain", "packed"])
def test_resume_is_exact_with_fim(tmp_path, tok, kind):
    train = _build(tmp_path, tok, FIMConfig(rate=0.5, seed=1))
    make = {
        "pretrain": lambda: PretrainLoader(train, seq_len=24, batch_size=2, seed=5, max_epochs=3),
        "packed": lambda: PackedLoader(train, seq_len=48, batch_size=2, seed=5, max_epochs=3),
    }[kind]
    whole = list(make())
    assert len(whole) > 4 and whole[0]["input_ids"].shape == whole[-1]["input_ids"].shape
    sentinel = tok.token_id(PRE)
    assert any((b["input_ids"] == sentinel).any() for b in whole)
    cut = len(whole) // 2 + 1  # not on an epoch boundary
    head = make()
    it = iter(head)
    for _ in range(cut):
        next(it)
    resumed = make()
    resumed.load_state_dict(head.state_dict())
    rest = list(resumed)
    assert len(rest) == len(whole) - cut
    for a, b in zip(rest, whole[cut:]):
        assert all(np.array_equal(a[k], b[k]) for k in a)
    if kind == "pretrain":  # a window FIM made shorter is padded, and the padding predicts nothing
        for b in whole:
            pad = (b["labels"] == -100).numpy().astype(int)
            assert (np.diff(pad, axis=1) >= 0).all()  # -100 only as a tail


def test_fim_needs_the_tokenizer_or_an_explicit_off(tmp_path, tok):
    train = _build(tmp_path, tok, FIMConfig())
    import shutil

    shutil.rmtree(tmp_path / "tokenizer")
    with pytest.raises(ValueError, match="needs the tokenizer"):
        PretrainLoader(train, seq_len=16, batch_size=1)
    assert PretrainLoader(train, seq_len=16, batch_size=1, fim=False).fim is None
    assert PretrainLoader(train, seq_len=16, batch_size=1, tokenizer=tok).fim is not None


def test_a_padded_window_marks_its_padding_and_the_batch_keeps_one_shape():
    """A window FIM left shorter carries segment_ids (0 = padding: out of the balancing load and aux loss, the
    model's data contract); the other rows of its batch get one segment of ones, so the batch stacks."""
    padded = {"input_ids": np.arange(4), "labels": np.array([1, 2, -100, -100]), "segment_ids": np.array([1, 1, 1, 0])}
    plain = {"input_ids": np.arange(4), "labels": np.arange(1, 5)}
    batch = PretrainLoader._collate([plain, padded])
    assert batch["segment_ids"].tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]
    assert set(PretrainLoader._collate([plain, plain])) == {"input_ids", "labels"}  # no padding: no mask path
