"""Rejection-sampling filters on hand-made trajectories: truncated, repetitive, format-invalid, wrong, kept."""

from glmstack.posttrain.rejection import repetitive, why_rejected
from glmstack.posttrain.rollout import Trajectory
from glmstack.posttrain.synthetic import generate
from glmstack.posttrain.tools import TOOLS


def traj(item, texts, replies, finish=None, extra=()):
    t = Trajectory(item)
    t.texts, t.finish = list(texts), list(finish or ["stop"] * len(texts))
    t.messages = list(replies) + list(extra)
    return t


def arithmetic_item(thinking=True):
    rec = next(r for r in generate("arithmetic", 10) if r["enable_thinking"] == thinking)
    return {"messages": rec["messages"][:1], "tools": None, "enable_thinking": thinking, "meta": rec["meta"]}


def reply(content, reasoning=None, calls=None):
    m = {"role": "assistant", "content": content, "reasoning_content": reasoning}
    return m | ({"tool_calls": calls} if calls else {})


def test_filters_in_order():
    item = arithmetic_item()
    answer = item["meta"]["answer"]
    good = reply(f"The answer is {answer}.", "We add.")
    text = f"\n<think>We add.</think>\nThe answer is {answer}."
    assert why_rejected(traj(item, [text], [good])) is None
    assert why_rejected(traj(item, [text], [good], finish=["length"])) == "truncated"
    loop = "the answer is the answer is " * 6
    assert why_rejected(traj(item, [loop], [reply(loop, "x")])) == "repetitive"
    assert why_rejected(traj(item, [f"\nThe answer is {answer}."], [reply(f"The answer is {answer}.")])) == "format"
    assert (
        why_rejected(traj(item, ["\n<think>x</think>\n<tool_call>oops"], [reply("<tool_call>oops", "x")])) == "format"
    )
    wrong = reply(f"The answer is {int(answer) + 1}.", "We add.")
    assert why_rejected(traj(item, ["\n<think>We add.</think>\nwrong"], [wrong])) == "wrong"


def test_no_thinking_item_rejects_reasoning():
    item = arithmetic_item(thinking=False)
    answer = item["meta"]["answer"]
    assert why_rejected(traj(item, [f"\nThe answer is {answer}."], [reply(f"The answer is {answer}.")])) is None
    bad = reply(f"The answer is {answer}.", "thought anyway")
    assert why_rejected(traj(item, [f"\n<think>thought anyway</think>\n{answer}"], [bad])) == "format"


def test_tool_call_schema_is_checked():
    rec = next(r for r in generate("tools", 10) if r["meta"]["tool"] == "calculator")
    item = {"messages": rec["messages"][:1], "tools": TOOLS, "enable_thinking": rec["enable_thinking"],
            "meta": rec["meta"]}  # fmt: skip
    r = "x" if rec["enable_thinking"] else None
    bad_call = [{"function": {"name": "calculator", "arguments": '{"expr": "1"}'}}]
    final = reply(f"The result is {rec['meta']['answer']}.", r)
    t = traj(item, ["a", "b"], [reply(None, r, bad_call), final], extra=[])
    assert why_rejected(t) == "format"


def test_repetitive():
    assert repetitive("a b c d " * 10) and not repetitive(
        "one two three four five six seven eight nine ten eleven twelve"
    )
