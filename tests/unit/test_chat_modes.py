"""GLM-5's thinking modes (glmstack.chat.modes): the loss masks of each mode, and the turn-prefix property.

The property token-in-token-out RL and the server's prefix cache rely on: the token ids of the prompt for the next
assistant message start with the ids of the previous prompt followed by the ids the model generated for it. Here a
"model" writes each assistant message exactly as the template's own format says (its reasoning, `</think>`, content,
tool calls, then the stop token), the client parses that completion (glmstack.chat.parse) and appends it, as a
server's client does, over hypothesis conversations of 10 user turns with tool rounds between them. With preserved
thinking (`clear_thinking=False`) it holds everywhere; with the templates' default (cleared) it breaks at the first
user turn after a thinking turn, exactly where a reasoning block was dropped (verl#6854); template renders of the
modes against the official jinja are in tests/parity/test_chat_templates.py.

    pytest tests/unit/test_chat_modes.py
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from glmstack.chat import encode, parse, render
from glmstack.chat.modes import MODES, check_mode, encode_mode, examples, user_turns
from glmstack.tokenizer import Tokenizer

TOOLS = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {
    "q": {"type": "string"}, "n": {"type": "integer"}}}}}]  # fmt: skip
CORPUS = ["Find the weather in Paris and answer in one line. The tool returned 18 degrees, sunny.\n",
          "I should search first, then answer. Results: 3 pages about Lyon, Nice and Rome.\n"] * 30  # fmt: skip


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.train(iter(CORPUS), vocab_size=500)


def call(q, n=1):
    return {"id": "call_0", "type": "function", "function": {"name": "search", "arguments": {"q": q, "n": n}}}


def asst(reasoning=None, content="", calls=None):
    m = {"role": "assistant", "content": content}
    if reasoning is not None:
        m["reasoning_content"] = reasoning
    return m | ({"tool_calls": calls} if calls else {})


CONV = [{"role": "system", "content": "S"}, {"role": "user", "content": "u1"}, asst("r1", "", [call("x")]),
        {"role": "tool", "content": "t"}, asst("r2", "c1"), {"role": "user", "content": "u2"}, asst("r3", "c2")]  # fmt: skip
CALL_47 = "<tool_call>search<arg_key>q</arg_key><arg_value>x</arg_value><arg_key>n</arg_key><arg_value>1</arg_value></tool_call>"
CALL_45 = ("\n<tool_call>search\n<arg_key>q</arg_key>\n<arg_value>x</arg_value>\n<arg_key>n</arg_key>\n<arg_value>1"
           "</arg_value>\n</tool_call>")  # fmt: skip


def spans(tok, ids, mask) -> list[str]:
    out, cur = [], []
    for i, m in zip([*ids, -1], [*mask, 0]):
        if m:
            cur.append(i)
        elif cur:
            out.append(tok.decode(cur))
            cur = []
    return out


def mode_spans(tok, messages, style, mode):
    return [spans(tok, ids, mask) for ids, mask in encode_mode(tok, messages, TOOLS, style, mode)]


# ---- masks --------------------------------------------------------------------------------------------------------


def test_masks_interleaved(tok):
    assert mode_spans(tok, CONV, "glm-4.7", "interleaved") == [
        [f"r1</think>{CALL_47}<|observation|>", "r2</think>c1<|endoftext|>"],
        ["r3</think>c2<|endoftext|>"],  # turn 1 is context here, its reasoning cleared (trained in its own example)
    ]
    assert mode_spans(tok, CONV, "glm-4.5", "interleaved") == [
        [f"\n<think>r1</think>{CALL_45}<|observation|>", "\n<think>r2</think>\nc1<|endoftext|>"],
        ["\n<think>r3</think>\nc2<|endoftext|>"],
    ]
    (_, second) = examples(CONV, "interleaved", "glm-4.7")
    assert "r1" not in render(second.messages, TOOLS, "glm-4.7", **second.options())


def test_masks_preserved(tok):
    # one sequence: every turn trained once, the earlier reasoning in the context of the later turns
    assert mode_spans(tok, CONV, "glm-4.7", "preserved") == [
        [f"r1</think>{CALL_47}<|observation|>", "r2</think>c1<|user|>", "r3</think>c2<|endoftext|>"]
    ]
    with pytest.raises(ValueError, match="preserved thinking needs the glm-4.7 template"):
        examples(CONV, "preserved", "glm-4.5")


def test_masks_turn_level(tok):
    conv = [*CONV[:-1], asst(None, "c2")]  # turn 2 answers without thinking
    exs = examples(conv, "turn", "glm-4.7")
    assert [e.enable_thinking for e in exs] == [True, False]
    # the non-thinking turn: `</think>` is the generation prompt's pre-fill (context), the answer is trained
    assert mode_spans(tok, conv, "glm-4.7", "turn")[1] == ["c2<|endoftext|>"]
    assert mode_spans(tok, conv, "glm-4.5", "turn")[1] == ["\nc2<|endoftext|>"]
    text = render(exs[1].messages, TOOLS, "glm-4.5", **exs[1].options())
    assert "u1/nothink" in text and "u2/nothink" in text  # GLM-4.5's switch marks every user turn of that request
    assert text.endswith("<|assistant|>\n<think></think>\nc2")


def test_one_turn_is_one_example_in_every_mode(tok):
    one = CONV[:5]
    want = [encode(tok, one, TOOLS, "glm-4.7")]
    for mode in MODES:
        assert encode_mode(tok, one, TOOLS, "glm-4.7", mode) == want


def test_turn_boundaries_and_bad_modes():
    sysmid = [{"role": "user", "content": "a"}, asst("r", "b"), {"role": "system", "content": "S2"},
              {"role": "user", "content": "c"}, asst("r", "d")]  # fmt: skip
    assert user_turns(sysmid) == [(0, 2), (2, 5)]  # a system message opens the turn it precedes
    assert examples([{"role": "user", "content": "a"}], "interleaved", "glm-4.7") == []  # nothing to train
    with pytest.raises(ValueError, match="unknown thinking mode"):
        check_mode("always", "glm-4.7")


# ---- the turn-prefix property -------------------------------------------------------------------------------------


def written(m: dict, style: str, thinking: bool) -> str:
    """The completion a model writes for assistant message m after the generation prompt (the template's format,
    stop token excluded): GLM-4.7's prompt pre-fills `<think>` or `</think>`, GLM-4.5's model opens the block itself."""
    r, c, calls = m.get("reasoning_content") or "", m.get("content") or "", m.get("tool_calls") or []
    if style == "glm-4.7":
        args = lambda a: "".join(f"<arg_key>{k}</arg_key><arg_value>{v}</arg_value>" for k, v in a.items())
        text = (f"{r}</think>" if thinking else "") + c
        return text + "".join(f"<tool_call>{x['function']['name']}{args(x['function']['arguments'])}</tool_call>"
                              for x in calls)  # fmt: skip
    args = lambda a: "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n" for k, v in a.items())
    text = (f"\n<think>{r}</think>" if thinking else "") + (f"\n{c}" if c else "")
    return text + "".join(f"\n<tool_call>{x['function']['name']}\n{args(x['function']['arguments'])}</tool_call>"
                          for x in calls)  # fmt: skip


def dialogue(tok, turns, style: str, clear_thinking: bool):
    """Play the conversation as a client of a server would: per assistant message, (prompt ids, completion ids,
    the next prompt's ids). The client keeps what parse() returns, reasoning included."""
    history, steps = [], []
    pending = None  # (prompt ids, completion ids) of the last assistant message
    for user_text, thinking, messages in turns:
        history.append({"role": "user", "content": user_text})
        for m in messages:
            if m["role"] == "tool":
                history.append(m)
                continue
            kw = {"enable_thinking": thinking, "clear_thinking": clear_thinking, "add_generation_prompt": True}
            prompt = tok.encode(render(history, TOOLS, style, **kw))
            if pending is not None:
                steps.append((*pending, prompt))
            text = written(m, style, thinking)
            stop = "<|observation|>" if m.get("tool_calls") else "<|user|>"
            got = parse(text + stop, TOOLS, style, in_reasoning=style == "glm-4.7" and thinking)
            want_reasoning = (m.get("reasoning_content") or "").strip() if thinking else ""
            assert got["content"] == (m["content"].strip() or None)  # the client reads back what was written
            assert got["reasoning_content"] == (want_reasoning or None)  # (stripped, as parse and the template do)
            assert [c["function"]["name"] for c in got["tool_calls"]] == [c["function"]["name"]
                                                                          for c in m.get("tool_calls") or []]  # fmt: skip
            history.append({k: v for k, v in got.items() if v})
            pending = (prompt, tok.encode(text) + [tok.token_id(stop)])
    return steps


def divergence(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(b) >= len(a) else len(b))


words = st.text(alphabet="abcdefghij klmnop,.0123456789", min_size=1, max_size=12).map(str.strip).filter(bool)


@st.composite
def messages_of_turn(draw, thinking: bool):
    out = []
    for _ in range(draw(st.integers(0, 2))):  # tool rounds before the answer
        calls = [call(draw(words), draw(st.integers(0, 99))) for _ in range(draw(st.integers(1, 2)))]
        out.append(asst(draw(words) if thinking else None, draw(st.one_of(st.just(""), words)), calls))
        out += [{"role": "tool", "content": draw(words)} for _ in calls]
    return [*out, asst(draw(words) if thinking else None, draw(words))]


@st.composite
def ten_turns(draw, switched: bool):
    turns = []
    for _ in range(10):
        thinking = draw(st.booleans()) if switched else True
        turns.append((draw(words), thinking, draw(messages_of_turn(thinking))))
    return turns


SETTINGS = {"deadline": None, "max_examples": 25, "suppress_health_check": [HealthCheck.too_slow,
            HealthCheck.function_scoped_fixture, HealthCheck.data_too_large]}  # fmt: skip


@settings(**SETTINGS)
@given(turns=ten_turns(switched=True))
def test_preserved_thinking_keeps_every_prompt_a_prefix(tok, turns):
    """GLM-4.7/5, clear_thinking=False, thinking switched per turn at random: every next prompt extends the last
    prompt + its completion, token for token, over 10 user turns with tool calls between them."""
    for prompt, completion, nxt in dialogue(tok, turns, "glm-4.7", clear_thinking=False):
        assert nxt[: len(prompt) + len(completion)] == prompt + completion


@pytest.mark.parametrize("style", ["glm-4.7", "glm-4.5"])
@settings(**SETTINGS)
@given(turns=ten_turns(switched=False))
def test_cleared_thinking_breaks_the_prefix_at_the_first_dropped_block(tok, style, turns):
    """The templates' default drops earlier turns' reasoning: inside a user turn (the tool loop) the prompts still
    extend each other, but the first prompt of the next user turn differs exactly where the finished turn's first
    reasoning block was: `<think>` now closes at once."""
    think, close = tok.token_id("<think>"), tok.token_id("</think>")
    broken = 0
    for prompt, completion, nxt in dialogue(tok, turns, style, clear_thinking=True):
        before = prompt + completion
        d = divergence(before, nxt)
        if d is None:
            continue
        broken += 1
        assert nxt[d] == close  # the dropped block: `</think>` where the reasoning was
        assert (before[d] == think) if style == "glm-4.7" else (before[d - 1] == think)
        assert prompt.count(tok.token_id("<|user|>")) < nxt.count(tok.token_id("<|user|>"))  # only across user turns
    assert broken == 9  # each of the 9 user turns after the first


def test_prefix_edge_cases_a_client_should_know(tok):
    """Where even preserved thinking cannot keep the prefix, because the template rewrites what the model wrote."""

    def first_break(turns, style="glm-4.7", clear=False):
        return [divergence(p + c, n) for p, c, n in dialogue(tok, turns, style, clear)]

    assert first_break([("q", True, [asst("r", "a")]), ("q2", True, [asst("r2", "b")])]) == [None]
    # empty reasoning in a thinking turn: the template writes a bare `</think>` where the prompt had `<think>`
    # (dialogue's stand-in model writes "</think>a" after the pre-filled "<think>")
    broken = first_break([("q", True, [asst("", "a")]), ("q2", True, [asst("r2", "b")])])
    assert broken[0] is not None
    # reasoning written with surrounding whitespace: the client's parse and the template strip it
    broken = first_break([("q", True, [asst(" r\n", "a")]), ("q2", True, [asst("r2", "b")])])
    assert broken[0] is not None
    # GLM-4.5: switching thinking off appends /nothink to EVERY user turn of that request, so a switched
    # conversation rewrites its history (no clear_thinking there either)
    broken = first_break([("q", True, [asst("r", "a")]), ("q2", False, [asst(None, "b")])], "glm-4.5", clear=True)
    assert broken[0] is not None
