"""Rejection-sampling filters on hand-made trajectories: truncated, repetitive, format-invalid, wrong, kept."""

from glmstack.posttrain.multiturn import Conversation
from glmstack.posttrain.rejection import repetitive, why_rejected
from glmstack.posttrain.synthetic import generate
from glmstack.posttrain.tools import TOOLS


def traj(item, texts, replies, finish=None, extra=()):
    t = Conversation(item)
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
    # reasoning that states the answer, then the answer: said twice is not a loop
    assert not repetitive("<think>The capital of Cuba is Havana.</think>\nThe capital of Cuba is Havana.")


def test_rejection_sample_accounts_for_every_sample(base_dir, tmp_path, capsys):
    from glmstack.posttrain import rejection
    from glmstack.posttrain.evaluate import items_of, load_engine

    items = items_of(generate("arithmetic", 2) + generate("tools", 1))
    cfg = rejection.RejectionConfig(k=2, hard_k=1, max_new_tokens=6, max_rounds=2)
    records, report = rejection.rejection_sample(load_engine(str(base_dir)), items, "glm-4.5", cfg)
    assert report["prompts"] == 3 and report["samples"] == 3 * 2 + report["hard_prompts"] * 1
    assert report["kept"] == len(records) and report["samples"] == report["kept"] + sum(report["dropped"].values())
    assert rejection.main([str(tmp_path / "nope"), "--out", str(tmp_path / "x.jsonl")]) == 2
    assert capsys.readouterr().err.strip().endswith("not a model folder (no config.json)")
