"""`glmstack generate` / `glmstack chat` on a tiny checkpoint folder (model + tokenizer), end to end."""

import io
import sys

import pytest
import torch

from glmstack.inference import Engine
from glmstack.inference.cli import chat_main, generate_main
from glmstack.model import GLM, ModelConfig, load_hf, save_hf
from glmstack.tokenizer import Tokenizer

TEXTS = ["hello world, the quick brown fox jumps over the lazy dog. " * 20, "def f(x):\n    return x + 1\n" * 20]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ckpt") / "tiny"
    save_hf(GLM(ModelConfig.preset("tiny")).init_weights(seed=0), folder)
    Tokenizer.train(TEXTS, vocab_size=320).save(folder)
    return str(folder)


def test_generate_matches_engine(ckpt, capsys):
    assert generate_main([ckpt, "--prompt", "hello world", "--max-new-tokens", "6", "--stats"]) == 0
    out, err = capsys.readouterr()
    tok = Tokenizer.load(ckpt)
    ref = Engine(load_hf(ckpt, dtype=torch.float32), tok).generate(["hello world"], 6)
    assert out == ref.text[0] + "\n"
    assert '"new_tokens"' in err


def test_generate_batch_speculative_and_bad_input(ckpt, capsys):
    args = [ckpt, "--prompt", "a b", "--prompt", "the quick", "--max-new-tokens", "4", "--speculative", "mtp"]
    assert generate_main(args) == 0
    assert capsys.readouterr().out.count("=== ") == 2
    assert generate_main([ckpt, "--prompt", "x", "--max-new-tokens", "0"]) == 2
    assert "max_new_tokens" in capsys.readouterr().err


def test_generate_seed_is_per_prompt(ckpt, capsys):
    """--seed S: the b-th prompt samples with S + b, so a batch prints what each prompt prints alone."""
    sampling = ["--max-new-tokens", "8", "--temperature", "1.0"]
    assert generate_main([ckpt, "--prompt", "a b", "--prompt", "the quick", "--seed", "5", *sampling]) == 0
    batch = capsys.readouterr().out
    assert generate_main([ckpt, "--prompt", "the quick", "--seed", "6", *sampling]) == 0
    alone = capsys.readouterr().out
    assert batch.split("=== 1 ")[1].split("\n", 1)[1] == alone


def test_chat_turns(ckpt, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("hi\n/reset\nhello again\n/exit\n"))
    assert chat_main([ckpt, "--max-new-tokens", "5", "--temperature", "0", "--system", "be brief"]) == 0
    assert "/exit" in capsys.readouterr().err
