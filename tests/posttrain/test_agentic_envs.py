"""Agentic environments (issue 18): each environment solved by a scripted policy and failed by a wrong one, the
failure rules (malformed call, fault injection, endless tool loop, environment crash, process rewards), the group
rules (crash exclusion, padding, staleness, reward − mean) and the token continuation of a tool turn."""

from __future__ import annotations

import json
import random

import pytest

from glmstack.chat import render
from glmstack.posttrain.agentic.env import EnvCrash, EnvOptions
from glmstack.posttrain.agentic.envs import make_env
from glmstack.posttrain.agentic.groups import advantages, settle
from glmstack.posttrain.agentic.trajectory import Trajectory, continuation_ids
from glmstack.posttrain.tools import calculate


def call(tool: str, /, **args) -> dict:
    return {"role": "assistant", "content": None,
            "tool_calls": [{"type": "function", "function": {"name": tool, "arguments": json.dumps(args)}}]}  # fmt: skip


def say(text: str) -> dict:
    return {"role": "assistant", "content": text}


def spec_of(name: str, seed: int = 0, level: int = 0) -> dict:
    env = make_env(name)
    return type(env).sample(random.Random(seed), "train", level)


def play(env, spec, messages):
    env.reset(spec)
    outs = []
    for m in messages:
        step = env.step(m)
        outs.append(step)
        if step.done:
            break
    return outs, env.reward()


def test_calculator_solved_and_failed():
    spec = spec_of("calculator")
    expr = spec["args"]["expression"]
    outs, r = play(make_env("calculator"), spec, [call("calculator", expression=expr), say("The result is X.")])
    assert outs[0].messages[0]["content"] == str(calculate(expr)) and not r.success
    _, r = play(make_env("calculator"), spec, [call("calculator", expression=expr),
                                               say(f"The result is {calculate(expr)}.")])  # fmt: skip
    assert r.success and r.value == 1.0


def test_python_tool_runs_in_the_sandbox():
    spec = spec_of("python")
    env = make_env("python")
    outs, r = play(env, spec, [call("python", code=spec["args"]["code"]), say("The result is ?")])
    result = outs[0].messages[0]["content"]
    _, r = play(make_env("python"), spec, [call("python", code=spec["args"]["code"]), say(f"The result is {result}.")])
    assert r.success and not result.startswith("Error")


def test_functions_env_checks_the_final_state_over_turns():
    spec = spec_of("functions", level=0)
    item, add, remove = spec["item"], spec["add"], spec["remove"]
    env = make_env("functions")
    outs, r = play(env, spec, [call("add_item", name=item, qty=add), say("Done."),
                               call("remove_item", name=item, qty=remove), say(f"{add - remove} left.")])  # fmt: skip
    assert outs[1].messages[0]["role"] == "user" and not outs[1].done  # the second user turn arrives
    assert r.success and env.stock == {item: add - remove}
    _, r = play(make_env("functions"), spec, [call("add_item", name=item, qty=add), say("Done."),
                                              say(f"{add - remove} left.")])  # fmt: skip
    assert not r.success  # the answer is right but the state is not: BFCL-style state check


def test_files_env_runs_tests_and_gives_the_process_bonus():
    spec = spec_of("files", level=1)
    env = make_env("files", EnvOptions(process_rewards=True))
    fixed = spec["files"]["calc.py"].replace(spec["files"]["calc.py"].split("return ")[1].strip(), spec["fix"])
    outs, r = play(env, spec, [call("run_tests"), call("write_file", path="calc.py", content=fixed),
                               call("run_tests"), say("Fixed.")])  # fmt: skip
    assert outs[0].messages[0]["content"].startswith("FAIL") and outs[2].messages[0]["content"] == "PASS"
    assert r.success and r.parts["tests_run"] == pytest.approx(0.1)
    _, r = play(make_env("files", EnvOptions(process_rewards=True)), spec, [say("Fixed.")])
    assert not r.success and r.parts["tests_run"] == 0.0


def test_roles_env_writer_then_reviewer():
    spec = spec_of("roles")
    a, b = spec["words"]
    outs, r = play(make_env("roles"), spec, [say(f"The {a} met the {b}."), say("APPROVE")])
    assert outs[0].messages[0]["content"].startswith("You are now the reviewer") and r.success
    _, r = play(make_env("roles"), spec, [say("A sentence."), say(f"REVISE: The {a} and the {b}.")])
    assert r.success
    _, r = play(make_env("roles"), spec, [say("A sentence."), say("APPROVE")])
    assert not r.success  # approving a draft without the words is the reviewer's failure


def test_malformed_call_ends_with_reward_zero():
    spec = spec_of("calculator")
    env = make_env("calculator")
    outs, r = play(env, spec, [call("calculator", expr="1+1")])  # wrong argument name: fails the schema
    assert outs[0].done and env.status == "malformed" and r.value == 0.0


def test_fault_injection_and_recovery_bonus():
    spec = spec_of("calculator")
    expr = spec["args"]["expression"]
    env = make_env("calculator", EnvOptions(fault_p=1.0, process_rewards=True))
    env.reset(spec)
    first = env.step(call("calculator", expression=expr)).messages[0]["content"]
    assert first.startswith("Error: the calculator")
    env.opts.fault_p = 0.0
    env.step(call("calculator", expression=expr))
    env.step(say(f"The result is {calculate(expr)}."))
    r = env.reward()
    assert r.success and r.parts["recover"] == pytest.approx(0.1)


def test_fault_rate_matches_p():
    env = make_env("calculator", EnvOptions(fault_p=0.3, max_tool_calls=10_000), seed=1)
    env.reset(spec_of("calculator"))
    outs = [env.step(call("calculator", expression="1+1")).messages[0]["content"] for _ in range(2000)]
    assert abs(sum(o.startswith("Error") for o in outs) / 2000 - 0.3) < 0.04


def test_tool_latency_waits_a_lognormal_time_and_leaves_the_fault_draws_alone():
    """tool_latency_s: every call waits first, median tool_latency_s, spread tool_latency_sigma (the long tail of
    bench/agentic_partial.py); the faults an episode draws are the same with and without it."""
    import statistics
    import time

    def run(opts):
        env = make_env("calculator", opts, seed=5)
        env.reset(spec_of("calculator"))
        waits, outs = [], []
        for _ in range(40):
            t0 = time.perf_counter()
            outs.append(env.step(call("calculator", expression="1+1")).messages[0]["content"])
            waits.append(time.perf_counter() - t0)
        return waits, outs

    plain = EnvOptions(fault_p=0.3, max_tool_calls=10_000)
    quick, faults = run(plain)
    slow, faults_slow = run(EnvOptions(fault_p=0.3, max_tool_calls=10_000, tool_latency_s=0.01, tool_latency_sigma=1.0))
    assert faults_slow == faults and any(o.startswith("Error") for o in faults)
    # the sleeps' median; no latency without it (the median: one call stalled by a loaded machine is not latency)
    assert 0.006 < statistics.median(slow) < 0.02 and statistics.median(quick) < 0.003
    assert max(slow) > 2.5 * statistics.median(slow)  # a tail: the largest of 40 draws ~ e^2.2 × the median


def test_endless_tool_loop_is_penalised_and_stopped():
    spec = spec_of("calculator")
    env = make_env("calculator", EnvOptions(max_tool_calls=4, free_calls=2, call_penalty=0.05, loop_penalty=0.2))
    outs, r = play(env, spec, [call("calculator", expression="1+1")] * 10)
    assert len(outs) == 5 and env.status == "loop"
    assert r.value == pytest.approx(-(0.05 * 2 + 0.2)) and not r.success


def test_environment_crash_is_marked():
    env = make_env("calculator", EnvOptions(crash_p=1.0))
    env.reset(spec_of("calculator"))
    with pytest.raises(EnvCrash):
        env.step(call("calculator", expression="1+1"))
    assert env.status == "env_error"


def traj(status="done", reward=1.0, version=0) -> Trajectory:
    t = Trajectory(task_id=0, index=0, spec={}, messages=[], tools=[], ids=[1, 2])
    t.add_model([3], [-0.5], version)
    t.status, t.reward = status, reward
    return t


def test_group_rules_exclusion_padding_and_staleness():
    ok, crash = traj(), traj("env_error", 0.0)
    kept, why = settle([ok, ok, ok, crash], 4, current=0, tau=0)  # 3 of 4 survive: padded
    assert kept is not None and len(kept) == 4 and crash not in kept and why["padded"] == 1 and why["env_error"] == 1
    kept, why = settle([ok, ok, crash, crash], 4, current=0, tau=0)  # exactly half: dropped
    assert kept is None and why["dropped_groups"] == 1
    old = traj(version=3)
    kept, _ = settle([old] * 4, 4, current=5, tau=2)
    assert kept is not None
    kept, why = settle([old] * 4, 4, current=6, tau=2)  # 6 − 3 > 2
    assert kept is None and why["stale"] == 4


def test_advantage_is_reward_minus_group_mean():
    adv = advantages([1.0, 0.0, 0.0, 0.0, 0.5, 0.5], group_size=3)
    assert adv.tolist() == pytest.approx([2 / 3, -1 / 3, -1 / 3, -1 / 3, 1 / 6, 1 / 6])


@pytest.mark.parametrize("style,thinking", [("glm-4.5", False), ("glm-4.5", True), ("glm-4.7", False)])
def test_continuation_tokens_equal_the_rendered_conversation(tok, style, thinking):
    """Prompt ids + the assistant's ids + continuation ids == the whole conversation rendered and encoded: the
    trajectory's context tokens are exactly the chat format, without re-tokenising the model's turn."""
    from glmstack.posttrain.tools import TOOLS

    user = [{"role": "user", "content": "Use Python to add up the numbers from 1 to 4."}]
    reply = call("python", code="print(sum(range(1, 5)))")
    tool = [{"role": "tool", "content": "10"}]
    prompt = render(user, TOOLS, style=style, enable_thinking=thinking, add_generation_prompt=True)
    with_reply = render(user + [reply], TOOLS, style=style, enable_thinking=thinking)
    assert with_reply.startswith(prompt)
    model_text = with_reply[len(prompt) :] + "<|observation|>"  # what the model generates, stop token included
    model_ids = tok.encode(model_text)
    ids = tok.encode(prompt) + model_ids
    ids += continuation_ids(tok, tool, style, thinking, after=model_ids[-1])
    want = tok.encode(render(user + [reply] + tool, TOOLS, style=style, enable_thinking=thinking,
                             add_generation_prompt=True))  # fmt: skip
    assert ids == want
