"""A chat request -> the prompt text and how to read the completion: tools, tool_choice and thinking.

What: `chat_prompt(req, style) -> ChatPrompt(text, prefill, tools, parse_calls, in_reasoning)`.

How each `tool_choice` is honoured (research/serving-protocol.md §1.1), without a constrained decoder:
  "none"      the tools are not rendered and `<tool_call>` output stays content (nothing is parsed as a call);
  "auto"      the tools are rendered; calls the model writes are parsed (glmstack.chat.parse / StreamParser);
  "required"  the prompt ends with the template's opening of an assistant turn up to `<tool_call>` (cut from
              its own rendering of a turn with a call: the text the model was trained on), so the model must
              name a function;
  {"type": "function", "function": {"name": N}}  the prompt ends `<tool_call>N`, so it calls N.
With a forced opening the parser reads `prefill` (`<tool_call>` [+ N]) before the completion.

`in_reasoning` is seeded from the prompt's tail (research/serving-protocol.md §6): a prompt ending in `<think>`
(GLM-4.7/5 with thinking on) starts the completion inside reasoning; otherwise the completion must open `<think>`.
"""

from __future__ import annotations

from dataclasses import dataclass

from glmstack.chat import render
from glmstack.chat.parse import CALL_OPEN, THINK_OPEN
from glmstack.chat.schema import tool_parameters
from glmstack.serve.protocol import ApiError, ChatRequest


@dataclass
class ChatPrompt:
    text: str  # what the model is conditioned on, pre-fill included
    prefill: str  # the completion's forced opening (read by the parser, not returned as content)
    tools: list | None  # the tools the parser types arguments with
    parse_calls: bool
    in_reasoning: bool


def chat_prompt(req: ChatRequest, style: str) -> ChatPrompt:
    tools = req.tools or None
    choice = req.tool_choice if req.tool_choice is not None else ("auto" if tools else "none")
    if tools:
        _check_tools(tools)
    named = _named(choice, tools)
    if choice == "required" and not tools:
        raise ApiError(400, "tool_choice 'required' needs a non-empty tools list", "tool_choice")
    kw = req.chat_template_kwargs
    opts = {"enable_thinking": kw.enable_thinking if kw else True, "clear_thinking": kw.clear_thinking if kw else True}
    shown_tools = None if choice == "none" else tools
    req.messages = [_reasoning_key(m) for m in req.messages]
    try:
        text = render(req.messages, shown_tools, style=style, add_generation_prompt=True, **opts)
        if choice == "required" or named:  # the model continues after the template's "<tool_call>" (+ name)
            text = _call_opening(req.messages, tools, style, opts) + (named or "")
            return ChatPrompt(text=text, prefill=CALL_OPEN + (named or ""), tools=tools, parse_calls=True,
                              in_reasoning=False)  # fmt: skip
    except (ValueError, TypeError, KeyError) as e:
        raise ApiError(400, f"messages: {e}", "messages") from None
    return ChatPrompt(
        text=text,
        prefill="",
        tools=tools,
        parse_calls=choice != "none",
        in_reasoning=text.rstrip().endswith(THINK_OPEN),
    )


def _reasoning_key(message: dict) -> dict:
    """vLLM >= 0.16 clients send history reasoning back as `reasoning`; the template reads `reasoning_content`
    (renaming it silently dropped history reasoning in vLLM #33616)."""
    if isinstance(message, dict) and "reasoning" in message:
        message = dict(message)
        reasoning = message.pop("reasoning")
        message.setdefault("reasoning_content", reasoning)
    return message


def _check_tools(tools: list) -> None:
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type", "function") != "function" or not isinstance(fn, dict):
            raise ApiError(400, f"tools[{i}]: expected {{'type': 'function', 'function': {{...}}}}", f"tools[{i}]")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ApiError(400, f"tools[{i}].function.name: a non-empty string is required", f"tools[{i}]")
    try:
        tool_parameters(tools)
    except (ValueError, TypeError) as e:
        raise ApiError(400, f"tools: {e}", "tools") from None


def _named(choice, tools) -> str | None:
    if not isinstance(choice, dict):
        return None
    name = (choice.get("function") or {}).get("name") if choice.get("type") == "function" else None
    if not isinstance(name, str):
        raise ApiError(400, "tool_choice: expected {'type': 'function', 'function': {'name': ...}}", "tool_choice")
    names = [t["function"]["name"] for t in tools or []]
    if name not in names:
        raise ApiError(400, f"tool_choice names function {name!r}, which is not in tools {names}", "tool_choice")
    return name


def _call_opening(messages, tools, style, opts) -> str:
    """The conversation followed by the template's own opening of an assistant turn, up to `<tool_call>`."""
    call = {"id": "call_0", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    turn = render([*messages, {"role": "assistant", "content": "", "tool_calls": [call]}], tools, style=style, **opts)
    return turn[: turn.rindex(CALL_OPEN) + len(CALL_OPEN)]
