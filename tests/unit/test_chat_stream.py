"""glmstack.chat.StreamParser: deltas add up to parse() of the whole text, whatever the chunk boundaries."""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from glmstack.chat import StreamParser, accumulate, parse, render

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"s": {"type": "string"}, "n": {"type": "integer"}}}}}]  # fmt: skip

# Pieces that make tags, partial tags, whitespace and text collide at every possible offset.
PIECES = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>",
          "</arg_value>", "<", "</", "<tool", "_call>", "think>", "f", "s", "n", "g h", "12", "\n", " ", "  \n",
          "text", "é😀", '{"a": [1]}', "True", "<|user|>", "<|observation|>", "<|end", "oftext|>"]  # fmt: skip
WELL_FORMED = st.builds(
    lambda s, n: f"<tool_call>f<arg_key>s</arg_key><arg_value>{s}</arg_value><arg_key>n</arg_key>"
    f"<arg_value>{n}</arg_value></tool_call>",
    st.sampled_from([" x ", "<b>", "", "\n"]), st.integers(-5, 5),
)  # fmt: skip
texts = st.lists(st.one_of(st.sampled_from(PIECES), WELL_FORMED, st.text(max_size=4)), max_size=25).map("".join)


def stream(text: str, cuts: list[int], **kwargs) -> list[dict]:
    parser = StreamParser(TOOLS, **kwargs)
    bounds = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    deltas = []
    for a, b in itertools.pairwise(bounds):
        deltas += parser.feed(text[a:b])
    return deltas + parser.finish()


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=texts, cuts=st.lists(st.integers(0, 400), max_size=40), style=st.sampled_from(["glm-4.5", "glm-4.7"]),
       in_reasoning=st.sampled_from([None, True, False]), calls=st.booleans())  # fmt: skip
def test_stream_equals_parse(text, cuts, style, in_reasoning, calls):
    """calls=False (the server's tool_choice="none") keeps call text as content, streamed or whole."""
    kwargs = {"style": style, "in_reasoning": in_reasoning, "calls": calls}
    assert accumulate(stream(text, cuts, **kwargs)) == parse(text, TOOLS, **kwargs)


@settings(max_examples=100, deadline=None)
@given(cuts=st.lists(st.integers(0, 300), max_size=60), style=st.sampled_from(["glm-4.5", "glm-4.7"]))
def test_stream_rendered_turn_char_by_char(cuts, style):
    msg = {"role": "assistant", "reasoning_content": "Think.", "content": "Answer:",
           "tool_calls": [{"name": "f", "arguments": {"s": " a\nb ", "n": 3}}, {"name": "g", "arguments": {}}]}  # fmt: skip
    text = render([{"role": "user", "content": "q"}, msg], TOOLS, style)
    completion = text[text.rindex("<|assistant|>") + len("<|assistant|>") :]
    expected = parse(completion, TOOLS, style)
    assert expected["reasoning_content"] == "Think." and len(expected["tool_calls"]) == 2
    assert accumulate(stream(completion, cuts, style=style)) == expected
    assert accumulate(stream(completion, list(range(len(completion))), style=style)) == expected


def test_delta_shapes_and_incremental_output():
    p = StreamParser(TOOLS, style="glm-4.5")
    assert p.feed("\n<thi") == []  # could be <think>: held
    assert p.feed("nk>Plan ") == [{"reasoning_content": "Plan"}]  # trailing space held
    assert p.feed("more</thi") == [{"reasoning_content": " more"}]
    assert p.feed("nk>\nHello <tool_") == [{"content": "Hello"}]
    assert p.feed("call>f\n<arg_key>n</arg_key>\n<arg_value>7</arg_value>\n") == []  # a call waits for its end
    deltas = p.feed("</tool_call>")
    assert deltas[0] == {"tool_calls": [{"index": 0, "id": "call_0", "type": "function",
                                         "function": {"name": "f", "arguments": ""}}]}  # fmt: skip
    assert "".join(d["tool_calls"][0]["function"]["arguments"] for d in deltas[1:]) == '{"n": 7}'
    assert p.feed(" <tool_call>f<arg_key>s") == []
    assert p.finish() == [{"content": "  <tool_call>f<arg_key>s"}]  # unterminated: content (+ the held space)
