"""glmstack.chat.encode: ids equal the tokenized render, and the loss mask covers exactly what the model writes."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from glmstack.chat import encode, render
from glmstack.tokenizer import Tokenizer

CORPUS = ["Hello there, how are you? I am fine.\n", "def f(x):\n    return x * 2\n", 'Paris 北京 😀 {"a": 1}'] * 30

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}]  # fmt: skip
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather?"},
    {"role": "assistant", "reasoning_content": "old thought", "content": "Let me check.",
     "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}]},
    {"role": "tool", "content": "sunny"},
    {"role": "assistant", "content": "ignored answer", "train": False},
    {"role": "user", "content": "Thanks"},
    {"role": "assistant", "reasoning_content": "be polite", "content": "You're welcome."},
]  # fmt: skip


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.train(iter(CORPUS), vocab_size=600)


def trained_text(tok, ids, mask) -> str:
    return tok.decode([i for i, m in zip(ids, mask) if m])


@pytest.mark.parametrize("style", ["glm-4.5", "glm-4.7"])
def test_ids_equal_whole_render(tok, style):
    ids, mask = encode(tok, CONVERSATION, TOOLS, style)
    assert len(ids) == len(mask)
    assert ids == tok.encode(render(CONVERSATION, TOOLS, style) + "<|endoftext|>")
    ids, _ = encode(tok, CONVERSATION[:-1], TOOLS, style, add_generation_prompt=True)
    assert ids == tok.encode(render(CONVERSATION[:-1], TOOLS, style, add_generation_prompt=True))


def test_mask_glm45(tok):
    ids, mask = encode(tok, CONVERSATION, TOOLS, "glm-4.5")
    assert trained_text(tok, ids, mask) == (
        # turn 1 is history (before the last user): no reasoning kept, its empty think is not trained
        "\nLet me check.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
        "<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call><|observation|>"
        # turn 2 has train=False; the last turn is trained from "\n<think>" (the model writes it) to the eos
        "\n<think>be polite</think>\nYou're welcome.<|endoftext|>"
    )


def test_mask_glm47(tok):
    ids, mask = encode(tok, CONVERSATION, TOOLS, "glm-4.7")
    assert trained_text(tok, ids, mask) == (
        "Let me check.<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
        "<arg_key>days</arg_key><arg_value>2</arg_value></tool_call><|observation|>"
        # the generation prompt pre-fills "<think>", so only what follows it is trained
        "be polite</think>You're welcome.<|endoftext|>"
    )


def test_turn_end_token_is_trained(tok):
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]
    ids, mask = encode(tok, msgs)
    user = tok.token_id("<|user|>")
    assert [m for i, m in zip(ids, mask) if i == user] == [0, 1]  # the first <|user|> is context, the second a stop
    assert ids[-1] != tok.token_id("<|endoftext|>")  # ends on a user turn: nothing appended


def test_loss_false_and_close(tok):
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "loss": False}]
    ids, mask = encode(tok, msgs)
    assert not any(mask) and ids[-1] == tok.token_id("<|endoftext|>")
    ids, mask = encode(tok, msgs[:1] + [{"role": "assistant", "content": "b"}], close_last_turn=False)
    assert ids == tok.encode(render(msgs)) and trained_text(tok, ids, mask) == "\nb"


texts = st.one_of(st.text(max_size=10), st.sampled_from([" ", "\n", " x ", "é😀", "/nothink", "<think>a</think>b"]))
args = st.dictionaries(st.sampled_from(["a", "b", "c"]), st.one_of(texts, st.integers(), st.lists(st.integers())))
message = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "tool"]), "content": texts}),
    st.fixed_dictionaries(
        {"role": st.just("assistant"), "content": texts},
        optional={
            "reasoning_content": texts,
            "train": st.booleans(),
            "tool_calls": st.lists(st.builds(lambda a: {"name": "f", "arguments": a}, args), max_size=2),
        },
    ),
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(msgs=st.lists(message, max_size=6), style=st.sampled_from(["glm-4.5", "glm-4.7"]),
       thinking=st.booleans(), prompt=st.booleans())  # fmt: skip
def test_ids_equal_whole_render_property(tok, msgs, style, thinking, prompt):
    ids, mask = encode(tok, msgs, TOOLS, style, enable_thinking=thinking, add_generation_prompt=prompt)
    text = render(msgs, TOOLS, style, enable_thinking=thinking, add_generation_prompt=prompt)
    closes = not prompt and msgs and msgs[-1]["role"] == "assistant"
    assert ids == tok.encode(text + ("<|endoftext|>" if closes else ""))
    assert set(mask) <= {0, 1}
    if not any(m["role"] == "assistant" and m.get("train", True) for m in msgs):
        assert not any(mask)


@pytest.mark.parametrize("style", ["glm-4.5", "glm-4.7"])
def test_transformers_apply_chat_template_gives_the_same_ids(tok, tmp_path, style):
    transformers = pytest.importorskip("transformers")
    tok.save(tmp_path, chat_style=style)
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    for msgs, prompt in [(CONVERSATION, False), (CONVERSATION[:-1], True)]:
        expected, _ = encode(tok, msgs, TOOLS, style, add_generation_prompt=prompt, close_last_turn=False)
        got = hf.apply_chat_template(msgs, tools=TOOLS, tokenize=True, add_generation_prompt=prompt,
                                     return_dict=False)  # fmt: skip
        assert list(got) == expected
