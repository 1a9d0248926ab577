"""Render OpenAI-shape conversations in GLM's chat format, as segments that know whether they are trained.

What: `render_segments(messages, tools, style, ...)` returns `Segment(text, trained)` pieces whose joined text is
exactly what the official jinja chat template renders; `render(...)` joins them. Styles:
  "glm-4.5": GLM-4.5 / GLM-4.6 (reference/chat_templates/glm-4.6.jinja): newlines after role tokens, `/nothink`
             on user turns when thinking is off, `\\n<think></think>` on history turns.
  "glm-4.7": GLM-4.7 / GLM-5 (glm-4.7.jinja): no newlines, `<think>` pre-filled in the generation prompt, a bare
             `</think>` on history turns, `clear_thinking=False` keeps the reasoning of every turn.

Why segments: the loss mask (glmstack.chat.encode) then comes from the same code that writes the text, so it
cannot drift from it. Trained = what the model generates (the assistant's tokens): reasoning and its
`</think>`, content, tool calls, and the `<|user|>`/`<|observation|>` token that ends an assistant turn (the stop
signal at inference). Everything else (system/user/tool text, role tokens, the tools block, empty think blocks and
the `<think>` that the 4.7 generation prompt pre-fills) is context.

Deviations from the jinja text, all on inputs where the template is broken: content None renders as "" (jinja
prints "None"), and JSON-string tool arguments are parsed (GLM-4.6's template fails on them, GLM-4.7's drops them).
Proof of equality: tests/parity/test_chat_templates.py (hypothesis conversations against the official templates).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from glmstack.chat.schema import check_messages, tool_calls, trains, visible_text

TURN_END_TOKENS = ("<|user|>", "<|observation|>")  # role tokens that double as stop tokens (eos ids)


@dataclass(frozen=True)
class Segment:
    text: str
    trained: bool = False


@dataclass(frozen=True)
class Style:
    """The literal strings in which the two template generations differ."""

    role_sep: str  # after <|system|> / <|user|>
    tools_format: str  # the example call in the tools system block
    think_open: str  # before kept reasoning
    think_open_trained: bool  # 4.5: the model writes "\n<think>"; 4.7: the generation prompt pre-fills it
    empty_think: str  # history turns / no reasoning
    content_sep: str
    call_open: str
    name_sep: str  # after the tool name
    arg_sep: str  # between </arg_key> and <arg_value>, and after </arg_value>
    response_open: str  # string tool content
    response_close: str
    list_response_open: str  # list tool content, per item
    nothink: bool  # "/nothink" on user turns when thinking is off
    prompt_thinking: str  # generation prompt suffix, thinking on
    prompt_no_thinking: str  # ... thinking off
    has_clear_thinking: bool


STYLES: dict[str, Style] = {
    "glm-4.5": Style(
        role_sep="\n",
        tools_format="<tool_call>{function-name}\n<arg_key>{arg-key-1}</arg_key>\n<arg_value>{arg-value-1}</arg_value>"
        "\n<arg_key>{arg-key-2}</arg_key>\n<arg_value>{arg-value-2}</arg_value>\n...\n</tool_call>",
        think_open="\n<think>",
        think_open_trained=True,
        empty_think="\n<think></think>",
        content_sep="\n",
        call_open="\n<tool_call>",
        name_sep="\n",
        arg_sep="\n",
        response_open="\n<tool_response>\n",
        response_close="\n</tool_response>",
        list_response_open="\n<tool_response>\n",
        nothink=True,
        prompt_thinking="",
        prompt_no_thinking="\n<think></think>",
        has_clear_thinking=False,
    ),
    "glm-4.7": Style(
        role_sep="",
        tools_format="<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key><arg_value>{arg-value-1}</arg_value>"
        "<arg_key>{arg-key-2}</arg_key><arg_value>{arg-value-2}</arg_value>...</tool_call>",
        think_open="<think>",
        think_open_trained=False,
        empty_think="</think>",
        content_sep="",
        call_open="<tool_call>",
        name_sep="",
        arg_sep="",
        response_open="<tool_response>",
        response_close="</tool_response>",
        list_response_open="<tool_response>",
        nothink=False,
        prompt_thinking="<think>",
        prompt_no_thinking="</think>",
        has_clear_thinking=True,
    ),
}


TEMPLATE_FILES = {"glm-4.5": "glm-4.6.jinja", "glm-4.7": "glm-4.7.jinja"}


def get_style(style: str) -> Style:
    if style not in STYLES:
        raise ValueError(f"unknown chat style {style!r} (expected one of {', '.join(STYLES)})")
    return STYLES[style]


def official_template(style: str) -> str:
    """The official jinja template of a style (vendored in glmstack/chat/templates): for tokenizer_config.json
    and for the parity tests; rendering itself never uses jinja."""
    get_style(style)
    return (Path(__file__).parent / "templates" / TEMPLATE_FILES[style]).read_text()


def render(messages, tools=None, style="glm-4.5", enable_thinking=True, clear_thinking=True,
           add_generation_prompt=False) -> str:  # fmt: skip
    """The conversation as the official template renders it (see module docstring)."""
    segments = render_segments(messages, tools, style, enable_thinking, clear_thinking, add_generation_prompt)
    return "".join(s.text for s in segments)


def render_segments(messages, tools=None, style="glm-4.5", enable_thinking=True, clear_thinking=True,
                    add_generation_prompt=False) -> list[Segment]:  # fmt: skip
    st = get_style(style)
    messages = check_messages(messages)
    segments = [Segment("[gMASK]<sop>")]
    if tools:
        segments.append(Segment(tools_block(tools, st)))
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=-1)
    keep_all_reasoning = st.has_clear_thinking and not clear_thinking
    ends_turn = False  # the previous message was a trained assistant turn: its stop token is trained
    for i, m in enumerate(messages):
        role = m["role"]
        if role == "assistant":
            current = i > last_user or keep_all_reasoning
            parts = _assistant(m, i, st, current)
        elif role == "user":
            parts = _user(m, st, enable_thinking)
        elif role == "tool":
            parts = _tool(m, st, first_of_run=i == 0 or messages[i - 1]["role"] != "tool")
        else:
            parts = [Segment("<|system|>"), Segment(st.role_sep + visible_text(m.get("content")))]
        if ends_turn and parts[0].text in TURN_END_TOKENS:
            parts[0] = Segment(parts[0].text, trained=True)
        ends_turn = role == "assistant" and trains(m)
        segments += parts
    if add_generation_prompt:
        suffix = st.prompt_thinking if enable_thinking else st.prompt_no_thinking
        segments.append(Segment("<|assistant|>" + suffix))
    return [s for s in segments if s.text]


def tools_block(tools, st: Style) -> str:
    """The tools system turn; each tool is dumped as passed (OpenAI envelope included)."""
    listed = "".join(json.dumps(t, ensure_ascii=False) + "\n" for t in tools)
    return (
        "<|system|>\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        f"{listed}</tools>\n\n"
        "For each function call, output the function name and arguments within the following XML format:\n"
        + st.tools_format
    )


def _user(m: Mapping, st: Style, enable_thinking: bool) -> list[Segment]:
    text = visible_text(m.get("content"))
    parts = [Segment("<|user|>"), Segment(st.role_sep + text)]
    if st.nothink and not enable_thinking and not text.endswith("/nothink"):
        parts.append(Segment("/nothink"))  # every user turn, as GLM-4.5/4.6's chat template does
    return parts


def _tool(m: Mapping, st: Style, first_of_run: bool) -> list[Segment]:
    content = m.get("content")
    if isinstance(content, Mapping):
        content = json.dumps(content, ensure_ascii=False)
    if content is None or isinstance(content, str):
        head = [Segment("<|observation|>")] if first_of_run else []  # consecutive results share one
        return head + [Segment(st.response_open + (content or "") + st.response_close)]
    # List content: one response per item, `output` when the item has one; always a fresh <|observation|>.
    items = [str(tr["output"]) if isinstance(tr, Mapping) and "output" in tr else str(tr) for tr in content]
    return [Segment("<|observation|>")] + [Segment(st.list_response_open + x + st.response_close) for x in items]


def reasoning_and_content(m: Mapping) -> tuple[str, str]:
    """(reasoning, content): `reasoning_content` when it is a string, else a `<think>…</think>` inside content."""
    content = visible_text(m.get("content"))
    reasoning = m.get("reasoning_content")
    if isinstance(reasoning, str):
        return reasoning, content
    if "</think>" in content:
        reasoning = content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
        return reasoning, content.split("</think>")[-1].lstrip("\n")
    return "", content


def _assistant(m: Mapping, i: int, st: Style, current: bool) -> list[Segment]:
    train = trains(m)
    reasoning, content = reasoning_and_content(m)
    parts = [Segment("<|assistant|>")]
    if current and reasoning:
        parts.append(Segment(st.think_open, train and st.think_open_trained))
        parts.append(Segment(reasoning.strip() + "</think>", train))
    else:
        parts.append(Segment(st.empty_think))  # template-injected, never generated
    if content.strip():
        parts.append(Segment(st.content_sep + content.strip(), train))
    for name, args in tool_calls(m, i):
        parts.append(Segment(_call_text(name, args, st), train))
    return parts


def _call_text(name: str, args: dict, st: Style) -> str:
    pairs = "".join(
        f"<arg_key>{k}</arg_key>{st.arg_sep}<arg_value>{_value_text(v)}</arg_value>{st.arg_sep}"
        for k, v in args.items()
    )
    return f"{st.call_open}{name}{st.name_sep}{pairs}</tool_call>"


def _value_text(v) -> str:
    """Strings go in raw (no quotes, no escaping); everything else as JSON, as the template's `tojson` does."""
    return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)
