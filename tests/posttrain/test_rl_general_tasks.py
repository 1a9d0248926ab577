"""The general-RL tasks distillation teachers bring (`tools`, `chat`: the SFT sets' first turns) and their rewards on
hand-made replies; prompts render the tools / system prompt, and held-out prompts never meet training ones."""

from __future__ import annotations

from glmstack.posttrain.rl import rewards
from glmstack.posttrain.rl.tasks import make_task


def sample(text, meta):
    return rewards.Sample(meta=meta, tokens=[1], text=text, finish="stop", max_new_tokens=32)


def call(name, key, value):
    return f"<tool_call>{name}\n<arg_key>{key}</arg_key>\n<arg_value>{value}</arg_value>\n</tool_call>"


def test_tool_call_reward_needs_the_call_to_do_the_tasks_work():
    meta = {"tool": "calculator", "arguments": {"expression": "(77 + 37) * 8"}}
    got = rewards.get("tool_call")([sample(call("calculator", "expression", "(77 + 37) * 8"), meta),
                                    sample(call("calculator", "expression", "8 * (37 + 77)"), meta),  # reordered
                                    sample(call("calculator", "expression", "(48 + 23) * 8"), meta),  # miscopied
                                    sample(call("calculator", "expression", "912"), meta),  # the answer typed in
                                    sample(call("python", "code", "print(912)"), meta),       # the wrong tool
                                    sample(call("calculator", "formula", "(77 + 37) * 8"), meta),  # not in its schema
                                    sample("The answer is 912.", meta)])  # fmt: skip
    assert got == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    meta = {"tool": "python", "arguments": {"code": "print(sum(range(1, 10 + 1)))"}}
    got = rewards.get("tool_call")([sample(call("python", "code", "print(sum(range(1, 11)))"), meta),  # same output
                                    sample(call("python", "code", "print(sum(range(1, 9 + 1)))"), meta),  # 45, not 55
                                    sample(call("python", "code", "import os; os.system('id')"), meta)])  # fmt: skip
    assert got == [1.0, 0.0, 0.0]


def test_chat_fact_reward():
    meta = {"answer": "Warsaw"}
    assert rewards.get("chat_fact")([sample("The capital is warsaw.", meta), sample("The answer is .", meta)]) == [
        1.0, 0.0]  # fmt: skip


def test_tools_and_chat_prompts(tok):
    tools, chat = make_task("tools", tok), make_task("chat", tok)
    for task in (tools, chat):
        train = task.problems(split="train", n=20, seed=0)
        test = task.problems(split="test", n=10, seed=0)
        key = (lambda p: str(p.meta.get("messages") or p.meta["question"]))
        assert not {key(p) for p in train} & {key(p) for p in test}
    [p] = tools.problems(split="train", n=1, seed=1)
    text = tok.decode(p.prompt_ids)
    assert "calculator" in text and "python" in text and p.meta["tool"] in ("calculator", "python")
    [c] = chat.problems(split="train", n=1, seed=1)
    assert "a helpful assistant" in tok.decode(c.prompt_ids) and c.meta["answer"]
