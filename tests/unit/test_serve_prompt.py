"""The server's request -> prompt rules (tool_choice, thinking state) and its per-choice text (stop strings, UTF-8)."""

import pytest

from glmstack.chat import parse
from glmstack.serve.outputs import ChoiceOutput
from glmstack.serve.prompt import chat_prompt
from glmstack.serve.protocol import ApiError, ChatRequest
from glmstack.serve.scheduler import Finished, Token
from glmstack.tokenizer import Tokenizer

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
    "x": {"type": "integer"}}}}}]  # fmt: skip
USER = [{"role": "user", "content": "hi"}]


def req(**kw):
    return ChatRequest(model="m", messages=USER, **kw)


@pytest.mark.parametrize("style", ["glm-4.5", "glm-4.7"])
def test_thinking_state_comes_from_the_prompt_tail(style):
    on = chat_prompt(req(), style)
    off = chat_prompt(req(chat_template_kwargs={"enable_thinking": False}), style)
    assert on.in_reasoning == (style == "glm-4.7")  # 4.7 pre-fills <think>; 4.5's model writes it
    assert off.in_reasoning is False and off.text.rstrip().endswith("</think>")
    # a 4.7 completion that skips thinking under thinking-off is content, not reasoning (SGLang #37645)
    assert parse("The answer.", style=style, in_reasoning=off.in_reasoning)["content"] == "The answer."


@pytest.mark.parametrize("style", ["glm-4.5", "glm-4.7"])
def test_tool_choice_rules(style):
    auto = chat_prompt(req(tools=TOOLS), style)
    assert auto.parse_calls and '"name": "f"' in auto.text and auto.prefill == ""
    none = chat_prompt(req(tools=TOOLS, tool_choice="none"), style)
    assert not none.parse_calls and '"name": "f"' not in none.text
    named = chat_prompt(req(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "f"}}), style)
    assert named.text.endswith("<tool_call>f") and named.prefill == "<tool_call>f"
    completion = "<arg_key>x</arg_key><arg_value>3</arg_value></tool_call>"
    call = parse(named.prefill + completion, TOOLS, style, in_reasoning=named.in_reasoning)["tool_calls"][0]
    assert call["function"] == {"name": "f", "arguments": '{"x": 3}'}
    assert chat_prompt(req(tools=TOOLS, tool_choice="required"), style).text.endswith("<tool_call>")
    for bad in ({"type": "function", "function": {"name": "g"}}, {"type": "function"}):
        with pytest.raises(ApiError, match="tool_choice"):
            chat_prompt(req(tools=TOOLS, tool_choice=bad), style)
    with pytest.raises(ApiError, match="required"):
        chat_prompt(req(tool_choice="required"), style)


def test_choice_output_holds_back_stop_strings_and_partial_characters():
    tok = Tokenizer.train(["stop here é😀 and more text " * 20], vocab_size=300)
    ids = tok.encode("abc STOP é😀 tail")
    out = ChoiceOutput(tok, ["STOP"], tok.eos_ids)
    shown = "".join(out.add(Token(t, 0.0, [])) for t in ids)
    assert shown == "abc " and out.stop_hit == "STOP"
    out.close(Finished("abort"))
    assert out.finish == "stop" and out.text == "abc "
    plain = ChoiceOutput(tok, [], tok.eos_ids)
    pieces = [plain.add(Token(t, 0.0, [])) for t in tok.encode("é😀")]
    assert all("\ufffd" not in p for p in pieces) and "".join(pieces) + plain.close(Finished("length")) == "é😀"


def test_history_reasoning_under_either_key():
    """`reasoning` (vLLM >= 0.16) and `reasoning_content` render the same; clear_thinking=False keeps it (GLM-4.7)."""
    turns = [
        *USER,
        {"role": "assistant", "content": "A.", "REASONING": "Because."},
        {"role": "user", "content": "more"},
    ]
    texts = []
    for key in ("reasoning", "reasoning_content"):
        msgs = [{(key if k == "REASONING" else k): v for k, v in m.items()} for m in turns]
        r = ChatRequest(model="m", messages=msgs, chat_template_kwargs={"clear_thinking": False})
        texts.append(chat_prompt(r, "glm-4.7").text)
    assert texts[0] == texts[1] and "<think>Because.</think>" in texts[0]
