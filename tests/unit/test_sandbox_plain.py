"""The verifier's plain-value codec (glmstack/sandbox/plain.py): exact round trips of plain data, refusals of
everything else on the candidate's side, and a decoder that turns any bytes into a plain value or NotPlain."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from glmstack.sandbox.plain import NotPlain, decode, encode

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
hashables = st.recursive(scalars, lambda c: st.tuples(c, c) | st.frozensets(c, max_size=3), max_leaves=8)
plain = st.recursive(
    scalars,
    lambda c: (
        st.lists(c, max_size=4)
        | st.tuples(c, c)
        | st.dictionaries(hashables, c, max_size=3)
        | st.sets(hashables, max_size=3)
        | st.frozensets(hashables, max_size=3)
    ),
    max_leaves=20,
)


def same(a, b) -> bool:
    """Equal with the same types all the way down (1 == 1.0 == True would hide a lost type)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return a == b


@settings(deadline=None)
@given(plain)
def test_plain_values_round_trip_with_their_types(v):
    assert same(decode(encode(v)), v)


def test_special_floats_and_big_ints():
    out = decode(encode([float("nan"), float("inf"), -float("inf"), -0.0, 10**300]))
    assert math.isnan(out[0]) and out[1:3] == [math.inf, -math.inf] and math.copysign(1, out[3]) == -1
    assert out[4] == 10**300


class Anything:
    def __eq__(self, other):
        return True


class Int(int):
    pass


@pytest.mark.parametrize("value", [Anything(), Int(3), [1, Int(2)], {"k": Anything()}, b"bytes", iter([]), print,
                                   (1, [2, {3: object()}])])  # fmt: skip
def test_anything_else_is_refused_on_the_candidate_side(value):
    with pytest.raises(NotPlain):
        encode(value)


def test_cycles_and_depth_are_refused():
    loop = []
    loop.append(loop)
    with pytest.raises(NotPlain):
        encode(loop)


@settings(deadline=None)
@given(st.binary(max_size=64) | st.text(max_size=64))
def test_any_bytes_decode_to_plain_or_notplain(raw):
    try:
        v = decode(raw)
    except NotPlain:
        return
    assert same(decode(encode(v)), v)  # whatever got through is plain data


@pytest.mark.parametrize("raw", ['{"x": 1}', '{"t": 1}', '{"d": [[[1], 2]]}', '{"d": [[1]]}', "[" * 100000,
                                 '{"t": [], "s": []}'])  # fmt: skip
def test_hostile_wire_text_is_notplain(raw):
    with pytest.raises(NotPlain):
        decode(raw)
