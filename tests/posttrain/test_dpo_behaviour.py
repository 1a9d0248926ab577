"""`glmstack dpo eval`: the preferred behaviour's rate in greedy replies (issue 39). The checker accepts exactly the
preferred reply (JSON by value, so spacing may differ) and rejects the rejected replies the preference sets make."""

from __future__ import annotations

import random

from glmstack.posttrain.dpo.behaviour import prefers
from glmstack.posttrain.rm.data import PAIRS


def test_the_chosen_reply_passes_and_the_rejected_one_fails():
    rng = random.Random(0)
    for kind, make in PAIRS.items():
        for _ in range(50):
            _, chosen, rejected = make(rng)
            assert prefers(kind, f"  {chosen}\n", chosen)
            assert not prefers(kind, rejected, chosen), (kind, rejected, chosen)


def test_json_is_compared_by_value():
    chosen = '{"name": "calculator", "arguments": {"expression": "41 * 11"}}'
    assert prefers("json", '{"arguments":{"expression":"41 * 11"},"name":"calculator"}', chosen)
    assert not prefers("json", '{"name": "calculator", "arguments": {"expression": "41 * 12"}}', chosen)
    assert not prefers("json", "The answer is 451.", chosen)


def test_eval_command_prints_one_row_per_model(base_dir, capsys):
    from glmstack.cli import main as glmstack

    assert glmstack(["dpo", "eval", str(base_dir), "--n", "6"]) == 0
    out = capsys.readouterr().out
    assert "| model | preferred (all) |" in out and f"| {base_dir} |" in out
