"""Plain values across the verifier's pipe: what a candidate function may return, and how it travels.

Why: the verdict on model-written code is decided outside the process that runs it (verifier.py). A value the
candidate returns crosses a pipe as text and is rebuilt in the grader from that text alone, so only *plain*
data reaches the tests: None, bool, int, float, str, and lists, tuples, dicts, sets and frozensets of them.
An object that is equal to everything, a subclass with a patched `__eq__`, a generator, a numpy scalar: none
of these survives the trip; the candidate side reports them as not plain, and whatever bytes a subverted
candidate writes instead are parsed by `json.loads` into plain values or refused.

Wire format: JSON (NaN and ±Infinity allowed, as Python's json writes them) with one-key objects as tags:
lists are arrays, `{"t": [...]}` a tuple, `{"d": [[k, v], ...]}` a dict (any plain hashable key),
`{"s": [...]}` a set, `{"f": [...]}` a frozenset.

This file is also the candidate side's encoder: the sandbox's boot.py execs its text (standard library only,
no `re` or `json` import: `_json`'s C string escaper is all it needs) and calls `encode`. The grader imports it
and calls `decode`.
"""

from __future__ import annotations

MAX_DEPTH = 64  # nesting the encoder follows; deeper (or cyclic) values are not plain


class NotPlain(ValueError):
    """The value (or a part of it) is not plain data; the message names the offending type."""


def encode(value) -> str:
    """`value` as wire text; raises NotPlain for anything but exact plain types (no subclasses)."""
    from _json import encode_basestring_ascii

    def enc(v, depth):
        t = type(v)
        if depth > MAX_DEPTH:
            raise NotPlain("nested too deeply (or cyclic)")
        if v is None:
            return "null"
        if t is bool:
            return "true" if v else "false"
        if t is int:
            return int.__repr__(v)
        if t is float:
            return float.__repr__(v).replace("nan", "NaN").replace("inf", "Infinity")
        if t is str:
            return encode_basestring_ascii(v)
        if t is list:
            return "[" + ",".join([enc(x, depth + 1) for x in v]) + "]"
        if t is tuple:
            return '{"t":[' + ",".join([enc(x, depth + 1) for x in v]) + "]}"
        if t is dict:
            items = [f"[{enc(k, depth + 1)},{enc(x, depth + 1)}]" for k, x in dict.items(v)]
            return '{"d":[' + ",".join(items) + "]}"
        if t is set or t is frozenset:
            return '{"' + ("s" if t is set else "f") + '":[' + ",".join([enc(x, depth + 1) for x in v]) + "]}"
        raise NotPlain(f"a {t.__name__!s} is not a plain value")

    return enc(value, 0)


_TAGS = {"t": tuple, "s": set, "f": frozenset}


def _untag(pairs):
    if len(pairs) != 1 or type(pairs[0][1]) is not list:
        raise NotPlain("a JSON object that is not a tag")
    tag, items = pairs[0]
    if tag == "d":
        if any(type(kv) is not list or len(kv) != 2 for kv in items):
            raise NotPlain("a dict tag with items that are not pairs")
        return dict(items)
    if tag not in _TAGS:
        raise NotPlain(f"unknown tag {tag!r}")
    return _TAGS[tag](items)


_DECODER = []  # one json.JSONDecoder, made on first use (json is not imported on the candidate side)


def decode(text: str | bytes):
    """The plain value in wire text; raises NotPlain for anything else (bad JSON, unknown tags, unhashable keys,
    too deep). Safe on hostile input: json's C scanner, no code runs."""
    if not _DECODER:
        import json

        _DECODER.append(json.JSONDecoder(object_pairs_hook=_untag))
    try:
        return _DECODER[0].decode(text.decode("utf-8") if isinstance(text, bytes) else text)
    except NotPlain:
        raise
    except (ValueError, TypeError, RecursionError, MemoryError) as e:  # bad JSON, unhashable key, too deep
        raise NotPlain(f"{type(e).__name__}: {str(e)[:200]}") from None
