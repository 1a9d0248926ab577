"""glmstack.tokenizer: exact round trip, GLM special tokens as single ids, HF save/load parity, the CLI."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from glmstack.tokenizer import EOS_TOKENS, SPECIAL_TOKENS, Tokenizer, main

CORPUS = [
    "The quick brown fox jumps over the lazy dog. " * 3,
    "def add(a, b):\n    return a + b\n\nprint(add(1, 2))\n",
    "Paris est la capitale de la France. 北京是中国的首都。 😀 emojis too.",
    '{"city": "Paris", "days": 2, "ok": true}',
    "<|user|>\nHi!<|assistant|>\n<think>Say hello.</think>\nHello!",
] * 20


PIECES = ["<think>", "</think>", "<|user|>", "a", " ", "\n", "é", "😀", "<", "|", "\r\n", "\x00", "\ufeff"]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.train(iter(CORPUS), vocab_size=512)


def test_vocab_layout(tok):
    assert 256 + len(SPECIAL_TOKENS) < tok.vocab_size <= 512  # a small corpus can run out of merges first
    ids = [tok.token_id(t) for t in SPECIAL_TOKENS]
    assert ids == list(range(tok.vocab_size - len(SPECIAL_TOKENS), tok.vocab_size))  # after the merges, GLM order
    assert tok.eos_ids == [tok.token_id(t) for t in EOS_TOKENS]
    with pytest.raises(KeyError):
        tok.token_id("<|nope|>")


@pytest.mark.parametrize("name", SPECIAL_TOKENS)
def test_special_tokens_are_single_ids(tok, name):
    assert tok.encode(name) == [tok.token_id(name)]
    assert tok.token_id(name) in tok.encode(f"ab{name}cd")
    assert tok.decode([tok.token_id(name)]) == name


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=60) | st.lists(st.sampled_from(PIECES), max_size=20).map("".join))
def test_round_trip_is_exact(tok, text):
    assert tok.decode(tok.encode(text)) == text


def test_encode_batch_matches_encode(tok):
    texts = CORPUS[:5] + ["", "<|user|>x"]
    assert tok.encode_batch(texts) == [tok.encode(t) for t in texts]


def test_save_load_and_transformers_parity(tok, tmp_path):
    tok.save(tmp_path)
    again = Tokenizer.load(tmp_path)
    texts = CORPUS[:5] + ["<tool_call>f<arg_key>a</arg_key><arg_value>1</arg_value></tool_call>", " \n\t x"]
    assert [again.encode(t) for t in texts] == [tok.encode(t) for t in texts]
    assert again.special_tokens == tok.special_tokens
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    for t in texts:
        assert hf.encode(t, add_special_tokens=False) == tok.encode(t)
        assert hf.decode(tok.encode(t)) == t
    assert hf.convert_tokens_to_ids("<|assistant|>") == tok.token_id("<|assistant|>")
    assert hf.eos_token == "<|endoftext|>"


def test_load_keeps_foreign_ids(tmp_path):
    """A folder whose added tokens sit elsewhere (other order, reserved tokens first) keeps its own ids."""
    from tokenizers import AddedToken
    from tokenizers import Tokenizer as HF

    base = Tokenizer.train(iter(CORPUS), vocab_size=512).backend.to_str()
    data = json.loads(base)
    data["added_tokens"] = []
    hf = HF.from_str(json.dumps(data))
    hf.add_special_tokens([AddedToken(f"<|reserved_{i}|>", special=True) for i in range(7)])
    hf.add_special_tokens([AddedToken(t, special=True) for t in reversed(SPECIAL_TOKENS)])
    hf.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    glm = Tokenizer.load(tmp_path)
    for name in SPECIAL_TOKENS:
        assert glm.token_id(name) == hf.token_to_id(name)
    assert glm.eos_ids == [hf.token_to_id(t) for t in EOS_TOKENS]
    assert glm.encode("<|user|>hi")[0] == hf.token_to_id("<|user|>")
    glm.save(tmp_path / "again")  # keeps the folder's own tokenizer_config.json, adds a chat template
    config = json.loads((tmp_path / "again" / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast" and "[gMASK]<sop>" in config["chat_template"]


def test_cli_train_and_encode(tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(CORPUS))
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text("".join(json.dumps({"text": t}) + "\n" for t in CORPUS[:5]))
    out = tmp_path / "tok"
    assert main(["train", "--input", str(corpus), str(jsonl), "--vocab-size", "400", "--out", str(out)]) == 0
    assert "MB/s" in capsys.readouterr().out
    assert main(["encode", "--tokenizer", str(out), "<|user|>Hi"]) == 0
    ids = json.loads(capsys.readouterr().out)
    assert ids[0] == Tokenizer.load(out).token_id("<|user|>")


def test_too_small_vocab():
    with pytest.raises(ValueError):
        Tokenizer.train(iter(["abc"]), vocab_size=100)
