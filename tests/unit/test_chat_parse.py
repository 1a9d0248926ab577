"""glmstack.chat.parse: reasoning split, schema-typed tool calls, malformed calls as content, bad-input errors,
and the BFCL round trip (ground-truth call -> render -> parse -> same typed call) on bfcl-eval's own data.

    pytest tests/unit/test_chat_parse.py -k bfcl -s     # prints the round-trip figures and failures
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from glmstack.chat import parse, render

WEATHER = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}]  # fmt: skip


def args_of(message, i=0):
    return json.loads(message["tool_calls"][i]["function"]["arguments"])


def test_reasoning_content_and_calls_glm45():
    text = "\n<think>Need data.</think>\nChecking.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n" \
           "<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>"  # fmt: skip
    m = parse(text, WEATHER)
    assert m["role"] == "assistant" and m["reasoning_content"] == "Need data." and m["content"] == "Checking."
    assert m["tool_calls"][0]["function"]["name"] == "get_weather"
    assert args_of(m) == {"city": "Paris", "days": 2}
    assert m["tool_calls"][0]["type"] == "function" and m["tool_calls"][0]["id"] == "call_0"


def test_prefilled_think_glm47():
    text = "Need data.</think>Sure.<tool_call>get_weather<arg_key>city</arg_key><arg_value>2</arg_value></tool_call>"
    m = parse(text, WEATHER, style="glm-4.7")
    assert (m["reasoning_content"], m["content"]) == ("Need data.", "Sure.")
    assert args_of(m) == {"city": "2"}  # a string parameter stays text even when it looks like a number
    assert parse("just an answer", style="glm-4.7", in_reasoning=False)["content"] == "just an answer"
    truncated = parse("still thinking", style="glm-4.7")
    assert truncated["reasoning_content"] == "still thinking" and truncated["content"] is None


def test_tool_call_inside_unterminated_reasoning_ends_it():
    m = parse("<think>hmm <tool_call>now</tool_call> done", style="glm-4.5")
    assert m["reasoning_content"] == "hmm" and m["content"] == "done"
    assert [c["function"]["name"] for c in m["tool_calls"]] == ["now"]


def test_zero_argument_and_several_calls():
    m = parse("<tool_call>now</tool_call><tool_call>now\n</tool_call>\n<tool_call>get_weather<arg_key>days</arg_key>"
              "<arg_value>3</arg_value></tool_call>", WEATHER)  # fmt: skip
    assert [c["function"]["arguments"] for c in m["tool_calls"]] == ["{}", "{}", '{"days": 3}']
    assert [c["id"] for c in m["tool_calls"]] == ["call_0", "call_1", "call_2"]
    assert m["content"] is None


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris",  # unterminated
        "<tool_call>get weather</tool_call>",  # space in the name
        "<tool_call></tool_call>",  # no name
        "<tool_call>f<arg_key>a</arg_key>junk<arg_value>1</arg_value></tool_call>",
        "<tool_call>f<arg_key>a</arg_key><arg_value>1</arg_value>junk</tool_call>",
        "<tool_call>f<arg_key>a</arg_key><arg_value>1</tool_call>",
    ],
)
def test_malformed_calls_are_content(text):
    m = parse("before " + text, WEATHER)
    assert m["tool_calls"] == [] and m["content"] == "before " + text


def test_stop_tokens_end_the_completion():
    m = parse("Hi.<tool_call>now</tool_call><|observation|>ignored <tool_call>x</tool_call>")
    assert m["content"] == "Hi." and len(m["tool_calls"]) == 1
    assert parse("<tool_call>f<|endoftext|></tool_call>")["content"] == "<tool_call>f"


def test_malformed_then_good_call():
    m = parse("<tool_call>a b</tool_call> x <tool_call>ok</tool_call>")
    assert m["content"] == "<tool_call>a b</tool_call> x" and m["tool_calls"][0]["function"]["name"] == "ok"


SCHEMA = [{"name": "f", "parameters": {"type": "dict", "$defs": {"Mode": {"type": "string", "enum": ["a", "b"]}},
    "properties": {
        "s": {"type": "string"}, "i": {"type": "integer"}, "x": {"type": "float"}, "t": {"type": "tuple"},
        "d": {"type": "dict"}, "any": {"type": "any"}, "u": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
        "o": {"oneOf": [{"type": "array"}, {"type": "null"}]}, "e": {"enum": ["1", "2"]}, "e2": {"enum": [1, 2]},
        "r": {"$ref": "#/$defs/Mode"}, "n": {"type": ["string", "null"]}, "b": {"type": "boolean"},
        "S": {"type": "String"}, "h": {"type": "HashMap"}}}}]  # fmt: skip


@pytest.mark.parametrize(
    "key,raw,value",
    [
        ("s", " 12 ", " 12 "), ("i", " 12 ", 12), ("x", "1.5", 1.5), ("t", "(1, 2)", [1, 2]), ("t", "[1, 2]", [1, 2]),
        ("d", "{'a': True}", {"a": True}), ("d", '{"a": null}', {"a": None}), ("any", "mapController", "mapController"),
        ("any", "[1]", [1]), ("u", "7", 7), ("u", "seven", "seven"), ("u", "[7]", "[7]"), ("o", "[1]", [1]),
        ("o", "null", None), ("e", "1", "1"), ("e2", "1", 1), ("r", "true", "true"), ("n", "x y", "x y"),
        ("b", "True", True), ("b", "false", False), ("S", "42", "42"), ("h", '{"k": 1}', {"k": 1}),
        ("i", "not a number", "not a number"), ("unknown", "3", 3), ("unknown", "{1, 2}", "{1, 2}"),
    ],
)  # fmt: skip
def test_typing_by_schema(key, raw, value):
    m = parse(f"<tool_call>f<arg_key>{key}</arg_key><arg_value>{raw}</arg_value></tool_call>", SCHEMA)
    assert args_of(m) == {key: value}


def test_unknown_tool_is_untyped():
    m = parse("<tool_call>g<arg_key>a</arg_key><arg_value>5</arg_value><arg_key>b</arg_key>"
              "<arg_value>hi there</arg_value></tool_call>", SCHEMA)  # fmt: skip
    assert args_of(m) == {"a": 5, "b": "hi there"}


# ---- bad input to render --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad,words",
    [
        ({"role": "robot", "content": "x"}, "unknown role"),
        ({"role": "assistant", "tool_calls": [{"function": {"arguments": {}}}]}, "no name"),
        ({"role": "assistant", "tool_calls": [{"name": "f", "arguments": "not json"}]}, "arguments"),
        ({"role": "assistant", "tool_calls": [{"name": "f", "arguments": "[1, 2]"}]}, "arguments"),
        ({"role": "assistant", "tool_calls": [{"name": "f", "arguments": 3}]}, "arguments"),
        ({"role": "user", "content": 5}, "content"),
        ("not a message", "mapping"),
    ],
)
@pytest.mark.parametrize("style", ["glm-4.5", "glm-4.7"])
def test_bad_messages_name_their_index(bad, words, style):
    with pytest.raises(ValueError, match=rf"message 1\b.*{words}"):
        render([{"role": "user", "content": "hi"}, bad], style=style)


def test_json_string_arguments_render_like_dicts():
    as_dict = [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {"a": [1, "x"]}}}]}]
    as_str = [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": '{"a": [1, "x"]}'}}]}]
    assert render(as_dict) == render(as_str)
    with pytest.raises(ValueError, match="unknown chat style"):
        render(as_dict, style="glm-9")


# ---- BFCL round trip ------------------------------------------------------------------------------------------

CATEGORIES = ["simple_python", "simple_java", "simple_javascript", "multiple", "parallel", "parallel_multiple"]
_OMIT = object()


def _bfcl_data() -> Path:
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("bfcl-eval is not installed")
    return Path(spec.submodule_search_locations[0]) / "data"


def _pick(options):
    """BFCL lists acceptable values per parameter; "" means "may be omitted". Take the first real one."""
    if not isinstance(options, list):
        return options
    for option in options:
        if option != "":
            return _clean(option)
    return _OMIT


def _clean(value):
    if isinstance(value, dict):  # nested dicts hold option lists too
        picked = {k: _pick(v) for k, v in value.items()}
        return {k: v for k, v in picked.items() if v is not _OMIT}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def bfcl_cases():
    data = _bfcl_data()
    for category in CATEGORIES:
        questions = _jsonl(data / f"BFCL_v4_{category}.json")
        answers = _jsonl(data / "possible_answer" / f"BFCL_v4_{category}.json")
        for q, a in zip(questions, answers, strict=True):
            assert q["id"] == a["id"]
            calls = [(name, _clean(options)) for call in a["ground_truth"] for name, options in call.items()]
            yield q["id"], q["function"], calls


def round_trip(style: str) -> tuple[int, list[str]]:
    total, failures = 0, []
    for case_id, tools, calls in bfcl_cases():
        message = {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": n, "arguments": args}} for n, args in calls]}  # fmt: skip
        text = render([{"role": "user", "content": "q"}, message], tools, style)
        completion = text[text.rindex("<|assistant|>") + len("<|assistant|>") :]
        parsed = parse(completion, tools, style)
        got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed["tool_calls"]]
        total += 1
        if got != calls:
            failures.append(f"{case_id}: expected {calls} got {got}")
    return total, failures


@pytest.mark.parametrize("style", ["glm-4.5", "glm-4.7"])
def test_bfcl_round_trip(style):
    total, failures = round_trip(style)
    print(f"\n{style}: {total - len(failures)}/{total} BFCL ground truths round-trip", *failures, sep="\n  ")
    assert total > 1000
    assert len(failures) <= 0.01 * total
