"""RL rewards, tasks and the stage tables (issue 17): each reward on hand-made completions, held-out splits that
never meet the training split, the curriculum row, the dynamic-temperature rule."""

from __future__ import annotations

import re

from glmstack.posttrain.rl import rewards
from glmstack.posttrain.rl.rollouts import informative, pick_temperature, plateaued, stage_at
from glmstack.posttrain.rl.tasks import make_task


def sample(text, meta=None, finish="stop", n=5, budget=32):
    return rewards.Sample(meta=meta or {}, tokens=list(range(n)), text=text, finish=finish, max_new_tokens=budget)


def test_arithmetic_and_math_rewards():
    meta = {"answer": "12"}
    got = rewards.get("arithmetic")(
        [sample("The answer is 12.", meta), sample("<think>7+5=12</think>The answer is 13.", meta)]
    )
    assert got == [1.0, 0.0]
    assert rewards.get("math")([sample("so x = 3/4", {"answer": "0.75"}), sample("x = 1", {"answer": "2"})]) == [
        1.0,
        0.0,
    ]
    assert rewards.get("arithmetic")([sample("12", meta)]) == [1.0]


def test_code_reward_runs_hidden_tests_in_the_sandbox(tok):
    task = make_task("code", tokenizer=tok)
    [p] = task.problems(split="train", n=1, seed=0)
    good = "```python\n" + p.meta["reference"] + "```"
    bad = "```python\ndef f(x):\n    return None\n```"
    assert rewards.get("code")([sample(good, p.meta), sample(bad, p.meta), sample("no code", p.meta)]) == [1.0, 0, 0]


def test_format_and_overlong():
    fmt = rewards.get("format")
    assert fmt([sample("<think>ok</think>The answer is 3."), sample("<think>never closed"),
                sample("fine", finish="length")]) == [1.0, 0.0, 0.0]  # fmt: skip
    over = rewards.get("overlong")
    budget, cache = 32, rewards.OVERLONG_CACHE
    vals = over(
        [sample("", n=budget - cache), sample("", n=budget - cache // 2), sample("", n=budget, finish="length")]
    )
    assert vals == [0.0, -0.5, -1.0]


def test_total_weights_and_means():
    out, means = rewards.total([sample("The answer is 4.", {"answer": "4"}, finish="length", n=32)],
                               [("arithmetic", 1.0), ("overlong", 0.5)])  # fmt: skip
    assert out == [0.5] and means == {"reward/arithmetic": 1.0, "reward/overlong": -1.0}


def test_task_splits_are_disjoint_and_deterministic():
    task = make_task("toy")
    train = task.problems(split="train", n=200, seed=0)
    test = task.problems(split="test", n=50, seed=0)
    assert not {tuple(p.prompt_ids) for p in train} & {tuple(p.prompt_ids) for p in test}
    assert [p.prompt_ids for p in task.problems(split="train", n=5, seed=3)] == [
        p.prompt_ids for p in task.problems(split="train", n=5, seed=3)
    ]


def test_curriculum_plateau_and_temperature_rules():
    table = [[0, 0, 16], [10, 2, 32, 8]]
    assert stage_at(table, 0) == [0, 0, 16, 0] and stage_at(table, 9) == [0, 0, 16, 0]
    assert stage_at(table, 10) == [10, 2, 32, 8]
    # dynamic sampling keeps groups whose rewards differ; stage 2 only hard ones: pass@2 = 0, pass@4 > 0
    assert not informative([1.0, 1.0, 1.0, 1.0], 0) and informative([1.0, 0.0, 0.0, 0.0], 0)
    assert not informative([1.0, 0.0, 0.0, 0.0], 2) and informative([0.0, 0.0, 0.0, 1.0], 2)
    assert plateaued([0.5] * 10, window=5, tol=0.01) and not plateaued([0.1] * 5 + [0.5] * 5, window=5, tol=0.01)
    assert not plateaued([0.5] * 9, window=5, tol=0.01)
    # the highest temperature within 1% (absolute) of the best held-out score
    assert pick_temperature({0.8: 0.50, 1.0: 0.495, 1.2: 0.48}) == 1.0
    assert pick_temperature({0.8: 0.40, 1.0: 0.50, 1.2: 0.30}) == 1.0


def test_compare_task_is_the_sft_sets_generator_and_split(tok):
    """The RL compare task draws from the SFT set's generator; its held-out problems never occur in SFT training;
    levels 4-7 (for RL past the SFT set) ask the same questions of two-digit numbers."""
    from glmstack.posttrain.synthetic import generate

    task = make_task("compare", tokenizer=tok)
    sft_train = {r["messages"][0]["content"] for r in generate("compare", 600)}
    for level in range(8):
        held = task.problems(split="test", n=20, seed=0, level=level)
        numbers = [int(n) for p in held for n in re.findall(r"\d+", p.meta["question"])]
        assert all((n >= 10) == (level >= 4) for n in numbers)
        assert not {p.meta["question"] for p in held} & sft_train
        right = [sample(f"The answer is {p.meta['answer']}.", p.meta) for p in held]
        wrong = [sample(f"The answer is {int(p.meta['answer']) + 10}.", p.meta) for p in held]
        assert rewards.get("arithmetic")(right) == [1.0] * 20 and rewards.get("arithmetic")(wrong) == [0.0] * 20
    assert held[0].meta["question"].startswith("Which is the") and held[0].meta["question"].count(",") == 1
    import random

    from glmstack.posttrain.synthetic import compare_item

    assert compare_item(random.Random(0), 9) == compare_item(random.Random(0), 7)  # the top level is 7


def test_reasoning_gym_task_and_reward(tok):
    """A reasoning-gym dataset as an RL task: disjoint held-out split, the dataset's own scorer as the reward, the
    curriculum level reaching the generator."""
    task = make_task("reasoning_gym:basic_arithmetic", tokenizer=tok)
    train = task.problems(split="train", n=40, seed=0)
    test = task.problems(split="test", n=10, seed=0)
    assert not {p.meta["question"] for p in train} & {p.meta["question"] for p in test}
    assert [p.prompt_ids for p in task.problems(split="test", n=3, seed=0)] == [p.prompt_ids for p in test[:3]]
    score = rewards.get("reasoning_gym")
    assert score([sample(f"The answer is {p.meta['answer']}.", p.meta) for p in test]) == [1.0] * 10
    assert max(score([sample("The answer is 123456789.", p.meta) for p in test])) < 0.5  # its partial credit

    def terms(problems):
        return max(p.meta["entry"]["metadata"]["num_terms"] for p in problems)

    assert terms(train) == 2 and terms(task.problems(split="train", n=40, seed=0, level=1)) == 3
