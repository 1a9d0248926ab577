"""Recovery SFT data for agentic RL with fault injection (docs/agentic.md, session 6): the opt-in
`tools_recovery` set renders in GLM's chat format with only the assistant's turns trained, its failures are the
environment's own injected failure texts, and leaving it out keeps the tools set byte for byte; the calculator's
level 1; `group_faults` gives the episodes of a group the same failures."""

import hashlib
import json
import random

import pytest

from glmstack.posttrain.agentic.env import FAULTS, EnvOptions, Reward
from glmstack.posttrain.agentic.envs import make_env
from glmstack.posttrain.agentic.envs.tools import CalculatorEnv, PythonEnv, wide_calculator_task
from glmstack.posttrain.sft_data import encode_record, normalize
from glmstack.posttrain.synthetic import OPT_IN_SETS, SETS, generate, verify
from glmstack.recipes import sft_speedrun
from tests.posttrain.test_sft_masks import trained_spans
from tests.posttrain.test_synthetic_tools import final_and_calls

# sha256 of json.dumps(generate("tools", 40, 0, split), sort_keys=True) before the recovery set existed
TOOLS_SHA = {"train": "ee863fdd8d148ae3ee479c2e249801fced1a446e7af0038d679345ccf190d25b",
             "test": "5c745a7cdee6ea22528687af442f8185bc6fcdb5d75e180d7b25d9ab08bc6053"}  # fmt: skip


@pytest.mark.parametrize("split", ["train", "test"])
def test_the_tools_set_is_unchanged_and_recovery_is_opt_in(split):
    data = json.dumps(generate("tools", 40, 0, split), sort_keys=True).encode()
    assert hashlib.sha256(data).hexdigest() == TOOLS_SHA[split]
    assert "tools_recovery" in OPT_IN_SETS and "tools_recovery" not in SETS
    assert not any("recovery" in d for d in sft_speedrun.sft().sft.data)


def test_recovery_records_repeat_the_failed_call_then_answer():
    train, test = generate("tools_recovery", 40), generate("tools_recovery", 10, split="test")
    assert {r["meta"]["split"] for r in train} == {"train"} and {r["meta"]["split"] for r in test} == {"test"}
    failures = {t.format(name=n) for t in FAULTS.values() for n in ("calculator", "python")}
    n_failed = set()
    for r in train + test:
        msgs = r["messages"]
        calls = [m["tool_calls"][0]["function"] for m in msgs if m.get("tool_calls")]
        results = [m["content"] for m in msgs if m["role"] == "tool"]
        assert all(c == calls[0] for c in calls) and len(calls) == len(results)  # the same call, repeated
        assert set(results[:-1]) <= failures and results[-1] == r["meta"]["answer"]
        n_failed.add(len(results) - 1)
        final, made = final_and_calls(r)
        assert verify(r["meta"], final, made)
    assert n_failed == {1, 2}


def test_recovery_records_train_only_the_assistants_turns(tok):
    for r in generate("tools_recovery", 12):
        spans = trained_spans(tok, normalize(r))
        n_calls = sum(bool(m.get("tool_calls")) for m in r["messages"])
        assert len(spans) == n_calls + 1  # every call turn and the answer, nothing else
        assert all(s.rstrip().endswith("</tool_call><|observation|>") for s in spans[:-1])
        assert spans[-1].endswith(f"The result is {r['meta']['answer']}.<|endoftext|>")
        assert not any("Error:" in s or "<tool_response>" in s for s in spans)  # the failures are context
        ids, _ = encode_record(tok, normalize(r), "glm-4.5")
        assert all(f in tok.decode(ids) for m in r["messages"] if m["role"] == "tool" for f in [m["content"]])


def test_a_recovery_record_replayed_in_the_environment_earns_the_recovery_bonus():
    """The record's tool messages are exactly what the fault-injecting environment answers."""
    rec = next(r for r in generate("tools_recovery", 20) if r["meta"]["tool"] == "calculator")
    env = make_env("calculator", EnvOptions(fault_p=1.0, process_rewards=True), seed=0)
    q = rec["messages"][0]["content"]
    env.reset({"question": q, "args": rec["messages"][1]["tool_calls"][0]["function"]["arguments"]})
    for m, reply in zip(rec["messages"][1::2], rec["messages"][2::2]):
        env.opts.fault_p = 1.0 if reply["content"].startswith("Error") else 0.0
        fn = m["tool_calls"][0]["function"]
        call = {"function": {"name": fn["name"], "arguments": json.dumps(fn["arguments"])}}
        step = env.step({"tool_calls": [call]})
        assert step.messages[0]["content"].startswith("Error") == reply["content"].startswith("Error")
        assert step.messages[0]["content"] == reply["content"] or reply["content"].startswith("Error")
    env.step(rec["messages"][-1])
    reward = env.reward()
    assert reward.success and reward.parts["recover"] > 0


def test_calculator_level_1_has_three_digit_operands():
    rng = random.Random(0)
    specs = [make_env("calculator").sample(rng, "test", 1) for _ in range(40)]
    assert len({s["question"] for s in specs}) == 40
    assert all(any(len(t) >= 3 for t in s["args"]["expression"].replace("(", " ").split()) for s in specs)
    env = make_env("calculator")
    env.reset(specs[0])
    env.step({"tool_calls": [{"function": {"name": "calculator", "arguments": json.dumps(specs[0]["args"])}}]})
    env.step({"role": "assistant", "content": f"The result is {env.answer_text()}."})
    assert env.reward().success
    assert wide_calculator_task(random.Random(1)) == wide_calculator_task(random.Random(1))


def test_retry_frac_counts_episodes_that_called_again_after_a_failure():
    from glmstack.posttrain.agentic.data import retry_stats
    from glmstack.posttrain.agentic.trajectory import Trajectory

    call = {"role": "assistant", "tool_calls": [{"function": {"name": "calculator", "arguments": "{}"}}]}
    fail = {"role": "tool", "content": FAULTS["timeout"].format(name="calculator")}
    ok, answer = {"role": "tool", "content": "5"}, {"role": "assistant", "content": "The result is 5."}
    convs = [[call, ok, answer], [call, fail, answer], [call, fail, call, ok, answer], [call, fail, call, fail]]
    trajs = [Trajectory(task_id=0, index=i, spec={}, messages=m, tools=[], ids=[1]) for i, m in enumerate(convs)]
    assert [t.retried for t in trajs] == [None, False, True, True]
    assert retry_stats(trajs) == {"retry_frac": 2 / 3} and retry_stats(trajs[:1]) == {}


def test_probe_scores_a_model_folder_on_held_out_tasks(base_dir, capsys):
    from glmstack.posttrain.agentic.probe import main, probe

    out = probe(str(base_dir), "calculator", level=1, n=3, fault_p=1.0)
    assert out["distinct"] == 3 and 0.0 <= out["success"] <= 1.0  # a random model: every call fails, if it calls
    assert set(out) <= {"success", "distinct", "retry_frac", "truncated_frac", "folds"}
    assert main(["/no/such/model"]) == 2
    assert capsys.readouterr().err.startswith("probe: /no/such/model")


def test_compare_table_and_held_out_plot_count_updates(tmp_path):
    from glmstack.posttrain.agentic.dashboard import compare, plot_compare

    runs = []
    for seed, end in ((0, 0.5), (1, 0.7)):
        run = tmp_path / f"s{seed}"
        run.mkdir()
        rows = [{"step": 1, "reward": 0.1, "heldout_success": 0.2, "heldout_faults_success": 0.1,
                 "heldout_faults_retry_frac": 0.0}, {"step": 2, "reward": 0.3}]  # fmt: skip
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        summary = {"heldout_success": end, "heldout_faults_success": 0.3, "heldout_faults_retry_frac": 1.0}
        (run / "agentic_summary.json").write_text(json.dumps(summary))
        runs.append(run)
    table = compare({"a": runs})
    assert "held-out @0 | held-out @2 |" in table and "retried after a failure @2" in table
    assert "| a | 2 | 0.200 ± 0.000 | 0.600 ± 0.141 |" in table
    assert plot_compare({"a": runs}, tmp_path / "h.png", key="heldout_success") and (tmp_path / "h.png").exists()


class FaultDraws(CalculatorEnv):
    """The calculator whose reward reports the episode's first fault draw (the environment's random stream)."""

    def reset(self, spec):
        self.first_draw = random.Random(self.rng.random()).random()  # a digest of the stream, leaving it unused
        return super().reset(spec)

    def reward(self):
        return Reward(0.0, False, {"draw": self.first_draw})


@pytest.mark.parametrize("together", [True, False])
def test_group_faults_give_a_groups_episodes_the_same_failures(base_dir, tok, together):
    from glmstack.model.hf import load_hf
    from glmstack.posttrain.agentic.episode import EpisodeOptions, run_group
    from glmstack.posttrain.agentic.worker import RolloutWorker

    opts = EpisodeOptions(max_turns=1, max_new_tokens=4)
    env = EnvOptions(fault_p=0.5, group_faults=together)
    worker = RolloutWorker(load_hf(base_dir), str(base_dir), opts, env, seed=0)
    spec = CalculatorEnv.sample(random.Random(0), "train") | {"env": f"{__name__}:FaultDraws"}
    trajs = run_group(worker.policy, tok, [spec] * 4, opts, env, [11, 12, 13, 14])
    assert len({t.parts["draw"] for t in trajs}) == (1 if together else 4)


def test_probe_groups_count_the_tasks_whose_episodes_disagree(base_dir, capsys):
    """--group: the coin's outcome is a fair flip per episode, so nearly every group of 8 is mixed; a random model
    never solves the calculator, so none of its groups is (no RL gradient there); greedy groups are refused."""
    from glmstack.posttrain.agentic.probe import main, probe

    coin = probe(str(base_dir), "tests.posttrain.agentic_coin:CoinEnv", n=6, temperature=1.0, group=8, max_turns=1)
    assert coin["mixed_groups"] >= 5 / 6 and coin["pass_at_group"] >= coin["mixed_groups"]
    assert 0.2 < coin["success"] < 0.8
    calc = probe(str(base_dir), "calculator", n=3, temperature=1.0, group=4, max_turns=1)
    assert calc["mixed_groups"] == 0.0 == calc["pass_at_group"]
    assert main([str(base_dir), "--group", "4"]) == 2 and "--temperature" in capsys.readouterr().err
    assert main([str(base_dir), "--group", "0", "--temperature", "1"]) == 2
    assert capsys.readouterr().err.strip() == "probe: --group 0: must be >= 1 (episodes per task)"


@pytest.mark.parametrize("env", [CalculatorEnv, PythonEnv])
def test_tool_envs_hold_out_the_tools_sets_held_out_prompts(env):
    """Agentic RL trains on the SFT tools set's tasks; the card scores that set's held-out prompts. Each environment
    keys its split by the question, as the set does, so no held-out prompt trains (keyed by the whole spec, a
    quarter of the python draws were card items: the python task has only ~46 prompts)."""
    def questions(split):
        return {r["messages"][0]["content"] for r in generate("tools", 600, 0, split)}

    held, train = questions("test"), questions("train")
    assert len(held) > 100 and all(q.endswith((".", "?")) for q in held)  # the prompts, not the answers
    for level in (0, 1):
        rng = random.Random(level)
        drawn = [env.sample(rng, "train", level)["question"] for _ in range(1500)]
        assert not set(drawn) & held
        tested = {env.sample(rng, "test", level)["question"] for _ in range(200)}
        assert not tested & train
    if env is PythonEnv:  # a finite task space: its held-out prompts are exactly the set's
        assert {env.sample(rng, "test", 0)["question"] for _ in range(300)} == {q for q in held if "Python" in q}
