"""glmstack.chat.render == the official GLM chat templates rendered by transformers' jinja code.

References: the official templates vendored in glmstack/chat/templates (glm-4.6.jinja for style "glm-4.5",
glm-4.7.jinja for "glm-4.7"; checked byte-equal to the reference copy in tests/data/reference/chat_templates, whose
PROVENANCE.md names their origin), rendered with `transformers.utils.chat_template_utils.render_jinja_template`
(trim_blocks, lstrip_blocks, tojson = json.dumps(ensure_ascii=False)), i.e. exactly what
`apply_chat_template(tokenize=False)` returns. Conversations come from hypothesis: all roles, unicode, list contents, reasoning in both forms, tool calls
with nested arguments, consecutive tool results, thinking on/off, clear_thinking.

    pytest tests/parity/test_chat_templates.py              # 60 conversations per style + fixed examples
    pytest tests/parity/test_chat_templates.py -m slow      # 500 per style
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference import reference_file

from glmstack.chat import render
from glmstack.chat.render import TEMPLATE_FILES, official_template

chat_template_utils = pytest.importorskip("transformers.utils.chat_template_utils")

STYLES = list(TEMPLATE_FILES)


def official(messages, tools=None, style="glm-4.5", **kwargs) -> str:
    rendered, _ = chat_template_utils.render_jinja_template(
        conversations=[messages], tools=tools, chat_template=official_template(style), **kwargs
    )
    return rendered[0]


@pytest.mark.parametrize("style", STYLES)
def test_vendored_templates_match_reference(style):
    assert official_template(style) == reference_file("chat_templates", TEMPLATE_FILES[style]).read_text()


# ---- strategies -----------------------------------------------------------------------------------------------

TRICKY = ["", " ", "\n", "  padded \n", "/nothink", "é 😀 中文", "<think>inner</think>after", "\nx</think>\ny",
          "a\n\nb", "{\"json\": 1}", "<tool_call>"]  # fmt: skip
texts = st.one_of(st.text(max_size=12), st.sampled_from(TRICKY))
list_items = st.one_of(
    st.builds(lambda t: {"type": "text", "text": t}, texts),
    texts,
    st.just({"type": "image_url", "image_url": {"url": "x.png"}}),
)
contents = st.one_of(texts, st.lists(list_items, max_size=3))
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**6), 10**6), st.floats(allow_nan=False, allow_infinity=False), texts
)
json_values = st.recursive(
    scalars, lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(texts, inner, max_size=3)),
    max_leaves=6,
)  # fmt: skip
names = st.from_regex(r"[a-z_][a-z0-9_.]{0,10}", fullmatch=True)


@st.composite
def tool_calls(draw):
    fn = {"name": draw(names), "arguments": draw(st.dictionaries(names, json_values, max_size=3))}
    if draw(st.booleans()):
        return {"id": "call_1", "type": "function", "function": fn}
    return fn


@st.composite
def messages(draw):
    role = draw(st.sampled_from(["system", "user", "assistant", "tool", "tool"]))
    if role == "assistant":
        m = {"role": role, "content": draw(contents)}
        if draw(st.booleans()):
            m["reasoning_content"] = draw(texts)
        if draw(st.booleans()):
            m["tool_calls"] = draw(st.lists(tool_calls(), min_size=1, max_size=3))
        return m
    if role == "tool":
        items = st.one_of(texts, st.builds(lambda t: {"output": t}, texts))
        return {"role": role, "content": draw(st.one_of(texts, texts, st.lists(items, max_size=3)))}
    return {"role": role, "content": draw(contents)}


tools_lists = st.one_of(
    st.none(),
    st.lists(
        st.builds(lambda n, p: {"type": "function", "function": {"name": n, "description": "é", "parameters": p}},
                  names, st.dictionaries(names, json_values, max_size=2)),
        max_size=2,
    ),
)  # fmt: skip
options = st.fixed_dictionaries(
    {"enable_thinking": st.booleans(), "clear_thinking": st.booleans(), "add_generation_prompt": st.booleans()}
)
conversations = st.tuples(st.lists(messages(), max_size=7), tools_lists, options)


def _check(style, conversation):
    msgs, tools, kwargs = conversation
    assert render(msgs, tools, style, **kwargs) == official(msgs, tools, style, **kwargs)


SETTINGS = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large]}


@pytest.mark.parametrize("style", STYLES)
@settings(max_examples=60, **SETTINGS)
@given(conversation=conversations)
def test_render_equals_template(style, conversation):
    _check(style, conversation)


@pytest.mark.slow
@pytest.mark.parametrize("style", STYLES)
@settings(max_examples=500, **SETTINGS)
@given(conversation=conversations)
def test_render_equals_template_500(style, conversation):
    _check(style, conversation)


# ---- fixed examples (research/glm-formats.md §2.2 and §3) ------------------------------------------------------

WEATHER = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
    }
]
TOOL_CONVERSATION = [
    {"role": "user", "content": "Weather in Paris for 2 days?"},
    {"role": "assistant", "content": "", "reasoning_content": "Need the weather tool.", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}},
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Lyon", "days": 1}}}]},
    {"role": "tool", "content": '{"temp_c": 18}'},
    {"role": "tool", "content": '{"temp_c": 20}'},
]  # fmt: skip
HISTORY = [
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "4", "reasoning_content": "2+2=4."},
    {"role": "user", "content": "Times 3?"},
    {"role": "assistant", "content": "12", "reasoning_content": "4*3=12."},
]
SYSTEM_HI = [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "Hi!"}]


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize(
    "msgs,tools,kwargs",
    [
        (SYSTEM_HI, None, {"add_generation_prompt": True}),
        (SYSTEM_HI, None, {"add_generation_prompt": True, "enable_thinking": False}),
        (TOOL_CONVERSATION, WEATHER, {"add_generation_prompt": True}),
        (HISTORY, None, {}),
        (HISTORY, None, {"clear_thinking": False}),
    ],
)
def test_documented_examples(style, msgs, tools, kwargs):
    assert render(msgs, tools, style, **kwargs) == official(msgs, tools, style, **kwargs)


def test_documented_strings():
    assert render(HISTORY) == (
        "[gMASK]<sop><|user|>\n2+2?<|assistant|>\n<think></think>\n4<|user|>\nTimes 3?<|assistant|>"
        "\n<think>4*3=12.</think>\n12"
    )
    assert render(HISTORY, style="glm-4.7", clear_thinking=False) == (
        "[gMASK]<sop><|user|>2+2?<|assistant|><think>2+2=4.</think>4<|user|>Times 3?<|assistant|>"
        "<think>4*3=12.</think>12"
    )
    assert render(SYSTEM_HI, add_generation_prompt=True, enable_thinking=False) == (
        "[gMASK]<sop><|system|>\nYou are a helpful assistant.<|user|>\nHi!/nothink<|assistant|>\n<think></think>"
    )
