"""FIM: every example reassembles the original exactly; rates match the config (the loader side: test_data_fim_loader)."""

import random

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from glmstack.data.fim import (
    MID,
    PRE,
    SUF,
    FIMConfig,
    choose,
    fim_ids,
    fim_split,
    fim_text,
    format_fim,
    has_sentinel,
    parse_fim,
)


@pytest.fixture(scope="module")
def tok():
    from glmstack.tokenizer import Tokenizer

    text = "def add(a, b):\n    return a + b\n" * 50 + "The quick brown fox jumps over the lazy dog. " * 50
    return Tokenizer.train([text], 400)


@settings(max_examples=300, deadline=None)
@given(text=st.text(), seed=st.integers(0, 2**32), mode=st.sampled_from(["psm", "spm_v2", "spm_glm"]))
def test_string_fim_reassembles(text, seed, mode):
    assume(not has_sentinel(text))  # such documents are never FIM-transformed (see test below)
    p, m, s = fim_split(text, random.Random(seed))
    assert p + m + s == text
    assert parse_fim(format_fim(p, m, s, mode), mode, prefix_len=len(p)) == (p, m, s)


def test_text_with_sentinels_is_left_alone():
    assert fim_text(f"x = '{MID}'", "a", FIMConfig(rate=1.0)) == f"x = '{MID}'"


def _reassemble(ids, tok):
    """Decode a token-level FIM example back to the document (PSM, SPM v2 and GLM SPM)."""
    pre, suf, mid = (tok.token_id(t) for t in (PRE, SUF, MID))
    if not ids or ids[0] not in (pre, suf):
        return tok.decode(ids)
    i_mid = ids.index(mid)
    if ids[0] == pre and ids[1] == suf:  # spm_v2: S after SUF, then P+M after MID
        return tok.decode(ids[i_mid + 1 :]) + tok.decode(ids[2:i_mid])
    if ids[0] == pre:  # psm
        i_suf = ids.index(suf)
        return tok.decode(ids[1:i_suf]) + tok.decode(ids[i_mid + 1 :]) + tok.decode(ids[i_suf + 1 : i_mid])
    i_pre = ids.index(pre)  # spm_glm
    return tok.decode(ids[i_pre + 1 : i_mid]) + tok.decode(ids[i_mid + 1 :]) + tok.decode(ids[1:i_pre])


@settings(max_examples=200, deadline=None)
@given(
    text=st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=0, max_size=200),
    doc_id=st.text(min_size=1, max_size=8),
    fmt=st.sampled_from(["spm_v2", "spm_glm"]),
)
def test_token_fim_reassembles(tok, text, doc_id, fmt):
    assume(not has_sentinel(text))
    cfg = FIMConfig(rate=1.0, spm_rate=0.5, spm_format=fmt)
    assert _reassemble(fim_ids(text, doc_id, tok, cfg), tok) == text


def test_rates_match_config():
    cfg = FIMConfig(rate=0.5, spm_rate=0.5)
    modes = [choose(f"doc{i}", cfg)[0] for i in range(10_000)]
    fim = [m for m in modes if m is not None]
    assert abs(len(fim) / len(modes) - 0.5) < 0.02
    assert abs(sum(m != "psm" for m in fim) / len(fim) - 0.5) < 0.02


def test_deterministic_and_identity_when_not_selected():
    cfg = FIMConfig(rate=0.0)
    assert fim_text("x = 1\n", "a", cfg) == "x = 1\n"
    cfg = FIMConfig(rate=1.0)
    assert fim_text("x = 1\n", "a", cfg) == fim_text("x = 1\n", "a", cfg)
