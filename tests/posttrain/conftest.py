import pytest

from glmstack.tokenizer import Tokenizer
from tests.posttrain.base import make_base


@pytest.fixture(scope="session")
def base_dir(tmp_path_factory):
    """A random tiny GLM + a BPE tokenizer with GLM's special tokens, as an HF folder."""
    return make_base(tmp_path_factory.mktemp("sft_base") / "base")


@pytest.fixture(scope="session")
def tok(base_dir):
    return Tokenizer.load(base_dir)
