"""Parse a GLM completion into an OpenAI assistant message: reasoning, content and typed tool calls.

What: `parse(text, tools, style) -> {"role": "assistant", "content", "reasoning_content", "tool_calls"}`, where
`tool_calls[i]["function"]["arguments"]` is a JSON string and each value is typed by the tool's schema
(glmstack.chat.schema.ArgTyper). This whole-text parser is the reference for glmstack.chat.stream.StreamParser.

Grammar (GLM-4.5's released tool-call format), lenient about whitespace so both styles parse with the same code:
  [ws] ["<think>"] reasoning ("</think>" | before "<tool_call>") { content | "<tool_call>" NAME PAIRS "</tool_call>" }
  PAIRS := { ws "<arg_key>" KEY "</arg_key>" ws "<arg_value>" VALUE "</arg_value>" } ws
Reasoning is open from the start when the completion starts with `<think>`, or when the prompt ended inside it
(`in_reasoning`; default True for "glm-4.7", whose generation prompt pre-fills `<think>`). A `<tool_call>` inside
unterminated reasoning ends it (GLM-5.1 does that, vLLM #42400). A call that is unterminated or does not match the
grammar is returned as content, verbatim; nothing here raises on model output.
Reasoning and content are `.strip()`ped (the template strips both); empty ones are None. Text from the first stop
token (`<|user|>`, `<|observation|>`, `<|endoftext|>`) on is ignored.
"""

from __future__ import annotations

import json
import re

from glmstack.chat.render import get_style
from glmstack.chat.schema import ArgTyper, tool_parameters

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
# A completion ends at GLM's stop tokens (config.json eos_token_id); engines that keep one in the text get it cut.
STOP_TOKENS = ("<|user|>", "<|observation|>", "<|endoftext|>")
_PAIR = re.compile(r"\s*<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>\s*", re.DOTALL)


def default_in_reasoning(style: str) -> bool:
    """GLM-4.7/5 prompts end in `<think>` (thinking on), so their completions start inside reasoning."""
    return get_style(style).prompt_thinking == THINK_OPEN


def parse(text: str, tools=None, style: str = "glm-4.5", in_reasoning: bool | None = None, calls: bool = True) -> dict:
    """calls=False keeps `<tool_call>` text as content (a server's tool_choice="none")."""
    if in_reasoning is None:
        in_reasoning = default_in_reasoning(style)
    text = text[: stop_index(text)]
    reasoning, rest = split_reasoning(text, in_reasoning)
    if not calls:
        return assistant_message(rest.strip(), reasoning.strip(), [])
    typers = _typers(tools)
    content, calls, pos = [], [], 0
    while True:
        start = rest.find(CALL_OPEN, pos)
        end = rest.find(CALL_CLOSE, start + len(CALL_OPEN)) if start >= 0 else -1
        if end < 0:  # no further call, or an unterminated one: the rest is content
            content.append(rest[pos:])
            break
        content.append(rest[pos:start])
        call = parse_call(rest[start + len(CALL_OPEN) : end], typers)
        if call is None:
            content.append(rest[start : end + len(CALL_CLOSE)])
        else:
            calls.append(call)
        pos = end + len(CALL_CLOSE)
    return assistant_message("".join(content).strip(), reasoning.strip(), calls)


def stop_index(text: str) -> int:
    """Index of the first stop token in `text`, else len(text)."""
    found = [i for i in (text.find(t) for t in STOP_TOKENS) if i >= 0]
    return min(found, default=len(text))


def split_reasoning(text: str, in_reasoning: bool) -> tuple[str, str]:
    """(reasoning, rest). Reasoning ends at the first `</think>` (consumed) or `<tool_call>` (kept in rest)."""
    stripped = text.lstrip()
    if stripped.startswith(THINK_OPEN):
        body = stripped[len(THINK_OPEN) :]
    elif in_reasoning:
        body = text
    else:
        return "", text
    close, call = body.find(THINK_CLOSE), body.find(CALL_OPEN)
    if close >= 0 and (call < 0 or close < call):
        return body[:close], body[close + len(THINK_CLOSE) :]
    if call >= 0:
        return body[:call], body[call:]
    return body, ""


def parse_call(body: str, typers: dict) -> tuple[str, dict] | None:
    """(name, typed arguments) of the text between `<tool_call>` and `</tool_call>`; None if malformed."""
    k = body.find("<arg_key>")
    name = (body if k < 0 else body[:k]).strip()
    if not name or "<" in name or ">" in name or any(c.isspace() for c in name):
        return None
    typer = typers.get(name) or ArgTyper(None)
    args: dict = {}
    pos = len(body) if k < 0 else k
    while pos < len(body):
        m = _PAIR.match(body, pos)
        if m is None:
            return None
        key = m.group(1).strip()
        args[key] = typer(key, m.group(2))
        pos = m.end()
    return name, args


def _typers(tools) -> dict[str, ArgTyper]:
    return {name: ArgTyper(params) for name, params in tool_parameters(tools).items()}


def call_dict(index: int, name: str, args: dict) -> dict:
    return {
        "id": f"call_{index}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)},
    }


def assistant_message(content: str, reasoning: str, calls: list[tuple[str, dict]]) -> dict:
    return {
        "role": "assistant",
        "content": content or None,
        "reasoning_content": reasoning or None,
        "tool_calls": [call_dict(i, name, args) for i, (name, args) in enumerate(calls)],
    }
