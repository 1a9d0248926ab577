"""Fixtures of the multimodal tests: a small trained tokenizer (saved, so transformers can read it) and the tiny
recipe's image processor."""

import pytest

from glmstack.multimodal.processor import VisionProcessor
from glmstack.tokenizer import Tokenizer

TEXTS = ["What colour is the shape? red green blue yellow. How many shapes are in the picture? 1 2 3 4.",
         "Which shape is in the picture? circle square triangle. What letter is written in the image? A B E H K"]


@pytest.fixture(scope="session")
def tok_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vtok")
    Tokenizer.train(TEXTS * 20, vocab_size=320).save(folder, chat_style="glm-4.5")
    return folder


@pytest.fixture(scope="session")
def tok(tok_dir):
    return Tokenizer.load(tok_dir)


@pytest.fixture(scope="session")
def proc():
    return VisionProcessor(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 16)
