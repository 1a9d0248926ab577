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
from glmstack.chat.modes import MODES, examples
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


# ---- GLM-5's thinking modes (glmstack.chat.modes): every example of every mode renders as the template does ------

def call(name, **args):
    return {"id": "call_0", "type": "function", "function": {"name": name, "arguments": args}}


def asst(reasoning=None, content="", calls=None):
    m = {"role": "assistant", "content": content}
    if reasoning is not None:
        m["reasoning_content"] = reasoning
    return m | ({"tool_calls": calls} if calls else {})


def user(text):
    return {"role": "user", "content": text}


def tool(text):
    return {"role": "tool", "content": text}


ADVERSARIAL = {
    # tool calls inside a turn and between user turns, two parallel calls answered by two results
    "tools_between_turns": [
        {"role": "system", "content": "You are terse."}, user("Weather in Paris?"),
        asst("Need the tool.", "", [call("get_weather", city="Paris", days=2)]), tool('{"temp_c": 18}'),
        asst("It is 18.", "18 degrees."), user("And Lyon and Nice?"),
        asst("Two calls.", "Checking both.", [call("get_weather", city="Lyon"), call("get_weather", city="Nice")]),
        tool('{"temp_c": 20}'), tool('{"temp_c": 22}'), asst("Both known.", "20 and 22."),
    ],
    # empty reasoning in every form: "", whitespace, no key, an empty <think></think> inside content
    "empty_reasoning": [
        user("a"), asst("", "A1"), user("b"), asst("  \n ", "B1"), user("c"), asst(None, "<think></think>C1"),
        user("d"), asst(None, "D1"),
    ],
    # reasoning and content that contain the format's own tags
    "tag_like_text": [
        user("What does <think> mean?"), asst("The tag </think> closes <think>; <|user|> is a role.", "A tag."),
        user("And <tool_call>?"),
        asst("Write <tool_call>f<arg_key>k</arg_key><arg_value>v</arg_value></tool_call> here.", "<|assistant|> x"),
        user("Inline?"), asst(None, "<think>\ninline thought\n</think>\nshown"),
    ],
    # many turns, tools, a system prompt between turns, a tool result given as a list
    "multi_turn_tools_system": [
        {"role": "system", "content": "S1"}, user("q1"), asst("r1", "", [call("get_weather", city="Rome")]),
        {"role": "tool", "content": [{"output": "sunny"}, "windy"]}, asst("r2", "a1"),
        {"role": "system", "content": "S2: now be brief"}, user("q2"), asst("r3", "a2"), user("q3"),
        asst(None, "a3 without thinking"), user("q4"), asst("r4", "", [call("get_weather", city="Oslo", days=1)]),
        tool("cold"), asst("r5", "a4"),
    ],
}  # fmt: skip


def _mode_cases(style):
    for name in ADVERSARIAL:
        for mode in MODES:
            if mode == "preserved" and style == "glm-4.5":
                continue  # the GLM-4.6 template has no clear_thinking (tests/unit/test_chat_modes.py)
            yield name, mode


@pytest.mark.parametrize("style", STYLES)
def test_modes_render_equals_template_on_adversarial_conversations(style):
    for name, mode in _mode_cases(style):
        msgs = ADVERSARIAL[name]
        exs = examples(msgs, mode, style)
        assert exs, (name, mode)
        for ex in exs:
            got = render(ex.messages, WEATHER, style, **ex.options())
            assert got == official(ex.messages, WEATHER, style, **ex.options()), (name, mode)
        # and every prompt a server renders for this conversation in this mode (each assistant message's prefix)
        for i, m in enumerate(msgs):
            if m["role"] == "assistant":
                for thinking in (True, False):
                    kw = {"clear_thinking": mode != "preserved", "enable_thinking": thinking,
                          "add_generation_prompt": True}  # fmt: skip
                    assert render(msgs[:i], WEATHER, style, **kw) == official(msgs[:i], WEATHER, style, **kw)


def test_modes_keep_and_drop_reasoning_as_documented():
    msgs = ADVERSARIAL["tools_between_turns"]
    interleaved = [render(e.messages, WEATHER, "glm-4.7", **e.options()) for e in examples(msgs, "interleaved", "glm-4.7")]
    (preserved,) = [render(e.messages, WEATHER, "glm-4.7", **e.options()) for e in examples(msgs, "preserved", "glm-4.7")]
    assert len(interleaved) == 2
    assert "<think>Need the tool.</think>" in interleaved[0] and "<think>It is 18.</think>" in interleaved[0]
    assert "Need the tool." not in interleaved[1] and "<think>Two calls.</think>" in interleaved[1]  # cleared
    assert all(f"<think>{r}</think>" in preserved for r in ("Need the tool.", "It is 18.", "Two calls.", "Both known."))
    # turn-level: a non-thinking turn's example is rendered with enable_thinking=False (GLM-4.5: /nothink everywhere)
    turn = examples(ADVERSARIAL["multi_turn_tools_system"], "turn", "glm-4.5")
    assert [e.enable_thinking for e in turn] == [True, True, False, True]
    assert render(turn[2].messages, WEATHER, "glm-4.5", **turn[2].options()).count("/nothink") == 3


@settings(max_examples=40, **SETTINGS)
@given(conversation=conversations, mode=st.sampled_from(MODES))
def test_modes_render_equals_template_random(conversation, mode):
    msgs, tools, _ = conversation
    for style in STYLES:
        if mode == "preserved" and style == "glm-4.5":
            continue
        try:
            exs = examples(msgs, mode, style)
        except ValueError:
            continue  # a conversation the renderer rejects (hypothesis draws bad tool-call names)
        for ex in exs:
            assert render(ex.messages, tools, style, **ex.options()) == official(ex.messages, tools, style,
                                                                                  **ex.options())  # fmt: skip
