"""Synthetic SFT sets: disjoint held-out splits, verifiers that accept the reference answers and reject others,
tool results that the sandbox really produced; the tools and their schema validation."""

import json

import pytest

from glmstack.posttrain.synthetic import SETS, generate, prompt_of, verify
from glmstack.posttrain.tools import TOOLS, calculate, execute, validate_call


def final_and_calls(record):
    replies = [m for m in record["messages"] if m["role"] == "assistant"]
    calls = [{"function": {"name": c["function"]["name"], "arguments": json.dumps(c["function"]["arguments"])}}
             for m in replies for c in m.get("tool_calls") or []]  # fmt: skip
    return replies[-1], calls


@pytest.mark.parametrize("name", SETS)
def test_sets_have_disjoint_splits_and_verifiable_answers(name):
    train, test = generate(name, 60), generate(name, 20, split="test")
    assert {r["meta"]["split"] for r in train} == {"train"} and {r["meta"]["split"] for r in test} == {"test"}
    key = lambda r: json.dumps(prompt_of(r))
    assert not {key(r) for r in train} & {key(r) for r in test}
    assert {r["enable_thinking"] for r in train} == {True, False}
    for r in train + test:
        final, calls = final_and_calls(r)
        assert verify(r["meta"], final, calls)
        assert bool(final.get("reasoning_content")) == r["enable_thinking"]
        assert not verify(r["meta"], {"role": "assistant", "content": "I do not know."}, [])
    assert generate(name, 10) == generate(name, 10)  # deterministic


def test_python_results_come_from_the_sandbox():
    recs = [r for r in generate("tools", 40) if r["meta"]["tool"] == "python"]
    assert recs
    for r in recs[:3]:
        call, result = r["messages"][1]["tool_calls"][0], r["messages"][2]["content"]
        assert execute("python", call["function"]["arguments"]) == result == r["meta"]["answer"]


def test_tools():
    assert calculate("(12 + 3) * 4") == 60 and calculate("7 / 2") == 3.5
    assert execute("calculator", '{"expression": "__import__(1)"}').startswith("Error: not arithmetic")
    assert execute("python", {"code": "print(sum(range(5)))"}) == "10"
    assert execute("python", {"code": "1/0"}) == "Error: ZeroDivisionError: division by zero"
    ok = {"function": {"name": "calculator", "arguments": '{"expression": "1+1"}'}}
    assert validate_call(ok, TOOLS) is None
    assert "unknown tool" in validate_call({"function": {"name": "shell", "arguments": "{}"}}, TOOLS)
    assert "'expression' is a required property" in validate_call(
        {"function": {"name": "calculator", "arguments": "{}"}}, TOOLS
    )
    assert "is not of type 'string'" in validate_call(
        {"function": {"name": "python", "arguments": '{"code": 5}'}}, TOOLS
    )


def test_chat_runs_builtin_tool_calls_in_the_sandbox(capsys):
    from glmstack.inference.cli import _run_tools, _tools

    assert _tools("builtin") == TOOLS
    calls = [{"function": {"name": "python", "arguments": '{"code": "print(6 * 7)"}'}},
             {"function": {"name": "calculator", "arguments": '{"expression": "2 ** 10"}'}}]  # fmt: skip
    assert _run_tools(calls) == [{"role": "tool", "content": "42"}, {"role": "tool", "content": "1024"}]
    assert capsys.readouterr().out == "[tool result] 42\n[tool result] 1024\n"
