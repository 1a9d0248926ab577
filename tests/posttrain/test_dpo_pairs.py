"""`glmstack dpo pairs`: on-policy preference pairs from a model's own samples (issue 39). The pair rule prefers the
best-scoring reply over the worst; the command keeps the task's train and held-out prompts apart, is a pure function
of its seed, and writes files that `glmstack rm` / `dpo` read. `glmstack dpo eval --task` scores a task's held-out
accuracy."""

from __future__ import annotations

import json
import random

import pytest

from glmstack.cli import main as glmstack
from glmstack.posttrain.dpo.pairs import pick_pair
from glmstack.posttrain.rl.tasks import split_of
from glmstack.posttrain.rm.data import read_pairs


def test_the_best_reply_is_chosen_over_the_worst():
    rng = random.Random(0)
    assert pick_pair(["The answer is 8.", "The answer is 3.", "8"], [1.0, 0.0, 1.0], rng)[1] == "The answer is 3."
    assert pick_pair(["a", "b", "c"], [0.2, 0.9, -0.5], rng) == ("b", "c")  # graded rewards (an RM): best over worst
    assert pick_pair(["a", "b"], [1.0, 1.0], rng) is None  # every reply alike: no preference to learn
    assert pick_pair(["", "b"], [0.0, 1.0], rng) is None  # an empty reply is no answer to prefer against
    draws = {pick_pair(["x", "y", "z"], [1.0, 1.0, 0.0], random.Random(s))[0] for s in range(20)}
    assert draws == {"x", "y"}  # ties among the best are drawn, not always the first


def test_pairs_command_splits_prompts_and_writes_readable_files(base_dir, tmp_path, capsys):
    argv = ["dpo", "pairs", str(base_dir), "--task", "compare", "--level", "0", "--n", "16", "--test-n", "8",
            "--samples", "8", "--max-new-tokens", "12", "--reward", "format"]  # fmt: skip
    assert glmstack([*argv, "--out", str(tmp_path / "a")]) == 0
    assert glmstack([*argv, "--out", str(tmp_path / "b")]) == 0
    report = json.loads((tmp_path / "a" / "pairs.json").read_text())
    assert report["rewards"] == [["format", 1.0]] and report["train"]["prompts"] == 16
    train = read_pairs(tmp_path / "a" / "train.jsonl", "dpo.data")
    test = read_pairs(tmp_path / "a" / "test.jsonl", "dpo.val_data")
    assert train and len(train) == report["train"]["pairs"]  # a random model stops in some samples, not in others
    assert all(split_of(p[0][0]["content"]) == "train" for p in train)
    assert all(split_of(p[0][0]["content"]) == "test" for p in test)
    assert all(p[1][0]["content"] != p[2][0]["content"] for p in train + test)
    for name in ("train.jsonl", "test.jsonl"):  # a pure function of the seed
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    with pytest.raises(SystemExit, match="^glmstack dpo pairs: unknown reward 'nope'"):
        glmstack(["dpo", "pairs", str(base_dir), "--reward", "nope", "--out", str(tmp_path / "c")])
    assert not (tmp_path / "c").exists()
    with pytest.raises(SystemExit, match="^glmstack dpo pairs: unknown RL task 'nope'"):
        glmstack(["dpo", "pairs", str(base_dir), "--task", "nope", "--out", str(tmp_path / "d")])


def test_eval_task_prints_held_out_accuracy(base_dir, capsys):
    assert glmstack(["dpo", "eval", str(base_dir), "--task", "compare", "--level", "0", "--n", "6"]) == 0
    out = capsys.readouterr().out
    assert "| model | compare held-out (accuracy) |" in out and f"| {base_dir} | 0." in out
    with pytest.raises(SystemExit, match="^glmstack dpo eval: unknown RL task 'nope'"):
        glmstack(["dpo", "eval", str(base_dir), "--task", "nope"])
