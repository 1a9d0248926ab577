"""Loss masks of every SFT record type, against hand-written expectations: the trained tokens are exactly the
assistant's own text and the token that ends its turn (issue 14 acceptance: masks)."""

import json

import pytest

from glmstack.posttrain.sft_data import MalformedRecord, encode_examples, encode_record, normalize

CALL = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "2+3"}}}
TOOLS = [{"type": "function", "function": {"name": "calculator", "parameters": {"type": "object",
          "properties": {"expression": {"type": "string"}}}}}]  # fmt: skip


def trained_spans(tok, record, style="glm-4.5"):
    """The decoded runs of trained tokens, in order."""
    ids, mask = encode_record(tok, normalize(record), style)
    spans, cur = [], []
    for i, m in zip(ids, mask):
        if m:
            cur.append(i)
        elif cur:
            spans.append(tok.decode(cur))
            cur = []
    return spans + ([tok.decode(cur)] if cur else [])


def user(text):
    return {"role": "user", "content": text}


def test_thinking_turn(tok):
    rec = {"messages": [user("Hi"), {"role": "assistant", "reasoning_content": "R", "content": "C"}]}
    assert trained_spans(tok, rec) == ["\n<think>R</think>\nC<|endoftext|>"]
    # 4.7 style: the generation prompt pre-fills <think>, so the model writes from the reasoning on
    assert trained_spans(tok, rec, "glm-4.7") == ["R</think>C<|endoftext|>"]


def test_no_thinking_turn(tok):
    rec = {"messages": [user("Hi"), {"role": "assistant", "content": "C"}], "enable_thinking": False}
    assert trained_spans(tok, rec) == ["\nC<|endoftext|>"]  # the empty think block is the template's, not trained
    assert trained_spans(tok, rec, "glm-4.7") == ["C<|endoftext|>"]


def test_tool_call_and_result(tok):
    rec = {"messages": [user("2+3?"), {"role": "assistant", "reasoning_content": "T", "content": "", "tool_calls": [CALL]},
                        {"role": "tool", "content": "5"}, {"role": "assistant", "reasoning_content": "U", "content": "5."}],
           "tools": TOOLS}  # fmt: skip
    call = "\n<tool_call>calculator\n<arg_key>expression</arg_key>\n<arg_value>2+3</arg_value>\n</tool_call>"
    # the tool result (<tool_response>...) is context; <|observation|> ends the calling turn, so it is trained
    assert trained_spans(tok, rec) == [
        f"\n<think>T</think>{call}<|observation|>",
        "\n<think>U</think>\n5.<|endoftext|>",
    ]


def test_arguments_as_json_string_or_object_encode_the_same(tok):
    as_string = {**CALL, "function": {**CALL["function"], "arguments": json.dumps(CALL["function"]["arguments"])}}
    recs = [{"messages": [user("x"), {"role": "assistant", "content": "", "tool_calls": [c]}], "tools": TOOLS}
            for c in (CALL, as_string)]  # fmt: skip
    assert encode_record(tok, normalize(recs[0]), "glm-4.5") == encode_record(tok, normalize(recs[1]), "glm-4.5")


def test_train_false_turn_is_context(tok):
    rec = {"messages": [user("2+2?"), {"role": "assistant", "content": "5", "train": False}, user("Check again."),
                        {"role": "assistant", "content": "4"}]}  # fmt: skip
    # the wrong turn and the <|user|> after it stay untrained; only the correction trains
    assert trained_spans(tok, rec) == ["\n4<|endoftext|>"]


@pytest.mark.parametrize(("style", "clear", "want"), [
    ("glm-4.5", True, ["\nA<|user|>", "\n<think>R2</think>\nB<|endoftext|>"]),
    ("glm-4.7", True, ["A<|user|>", "R2</think>B<|endoftext|>"]),
    ("glm-4.7", False, ["R1</think>A<|user|>", "R2</think>B<|endoftext|>"]),
])  # fmt: skip
def test_multi_turn_earlier_thinking_cleared_or_kept(tok, style, clear, want):
    rec = {"messages": [user("Q1"), {"role": "assistant", "reasoning_content": "R1", "content": "A"}, user("Q2"),
                        {"role": "assistant", "reasoning_content": "R2", "content": "B"}], "clear_thinking": clear}  # fmt: skip
    assert trained_spans(tok, rec, style) == want


def test_sharegpt_equals_openai(tok):
    openai = {"messages": [{"role": "system", "content": "S"}, user("Hi"), {"role": "assistant", "content": "Yo"}]}
    share = {"conversations": [{"from": "system", "value": "S"}, {"from": "human", "value": "Hi"},
                               {"from": "gpt", "value": "Yo"}]}  # fmt: skip
    assert encode_record(tok, normalize(share), "glm-4.5") == encode_record(tok, normalize(openai), "glm-4.5")
    assert trained_spans(tok, share) == ["\nYo<|endoftext|>"]


# ---- GLM-5's thinking modes (glmstack.chat.modes) through the SFT reader -------------------------------------------

TWO_TURNS = [user("Q1"), {"role": "assistant", "reasoning_content": "R1", "content": "A"}, user("Q2"),
             {"role": "assistant", "reasoning_content": "R2", "content": "B"}]  # fmt: skip


def mode_spans(tok, record, style, mode=""):
    return [trained_spans_of(tok, ids, mask) for ids, mask in encode_examples(tok, normalize(record), style, mode)]


def trained_spans_of(tok, ids, mask):
    spans, cur = [], []
    for i, m in zip([*ids, -1], [*mask, 0]):
        if m:
            cur.append(i)
        elif cur:
            spans.append(tok.decode(cur))
            cur = []
    return spans


PRESERVED = [["R1</think>A<|user|>", "R2</think>B<|endoftext|>"]]  # one example, every reasoning trained


@pytest.mark.parametrize(("mode", "want"), [
    ("", [["A<|user|>", "R2</think>B<|endoftext|>"]]),  # the record's own switches: one example, R1 cleared
    ("interleaved", [["R1</think>A<|endoftext|>"], ["R2</think>B<|endoftext|>"]]),  # one example per user turn
    ("preserved", PRESERVED),
    ("turn", [["R1</think>A<|endoftext|>"], ["R2</think>B<|endoftext|>"]]),
])  # fmt: skip
def test_thinking_modes_masks(tok, mode, want):
    assert mode_spans(tok, {"messages": TWO_TURNS}, "glm-4.7", mode) == want


def test_record_thinking_mode_wins_over_the_option(tok):
    assert mode_spans(tok, {"messages": TWO_TURNS, "thinking_mode": "preserved"}, "glm-4.7", "interleaved") == PRESERVED


def test_thinking_mode_field_is_checked(tok):
    with pytest.raises(MalformedRecord, match="thinking_mode must be one of"):
        normalize({"messages": TWO_TURNS, "thinking_mode": "sometimes"})
    with pytest.raises(ValueError, match="preserved thinking needs the glm-4.7 template"):
        encode_examples(tok, normalize({"messages": TWO_TURNS}), "glm-4.5", "preserved")


def test_synthetic_sets_in_each_mode():
    from glmstack.posttrain.synthetic import generate

    for mode in ("interleaved", "preserved"):  # every assistant message thinks, tool calls included
        for set_name in ("chat", "tools"):
            recs = generate(set_name, 12, thinking_mode=mode)
            assert all(r["thinking_mode"] == mode for r in recs)
            assert all(m.get("reasoning_content") for r in recs for m in r["messages"] if m["role"] == "assistant")
    turn = generate("chat", 40, thinking_mode="turn")
    switched = [r for r in turn if len({bool(m.get("reasoning_content")) for m in r["messages"]
                                        if m["role"] == "assistant"}) == 2]  # fmt: skip
    assert switched  # some conversations switch thinking between their turns
    assert all(r["enable_thinking"] == bool(r["messages"][-1].get("reasoning_content")) for r in turn)
    assert generate("chat", 5) == generate("chat", 5, thinking_mode="")  # the default is unchanged
