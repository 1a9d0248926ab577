"""`python -m glmstack.speedrun.seeds`: several runs' report cards as mean ± std per metric and stage; cells that are
not numbers ("not installed") stay out of the mean."""

from __future__ import annotations

import json

import pytest

from glmstack.speedrun.seeds import main, seed_table


def test_mean_and_std_over_runs_skip_non_numbers(tmp_path, capsys):
    cards = [{"SFT": {"tool task success": 0.5, "BFCL simple": "not installed (bfcl-eval)"}, "RL": {"tool task success": 0.9}},
             {"SFT": {"tool task success": 0.7, "BFCL simple": 0.25}, "RL": {"tool task success": 0.8}}]  # fmt: skip
    for i, card in enumerate(cards):
        (tmp_path / f"r{i}").mkdir()
        (tmp_path / f"r{i}" / "summary.json").write_text(json.dumps({"card": card}))
    table = seed_table(cards)
    assert table["tool task success"]["SFT"]["mean"] == pytest.approx(0.6)
    assert table["tool task success"]["SFT"]["std"] == pytest.approx(0.1414, abs=1e-4)
    assert table["BFCL simple"]["SFT"]["n"] == 1 and "RL" not in table["BFCL simple"]
    assert main([str(tmp_path / "r0"), str(tmp_path / "r1")]) == 0
    out = capsys.readouterr().out
    assert "| tool task success | 0.6 ± 0.14 | 0.85 ± 0.071 |" in out
    with pytest.raises(SystemExit, match="no summary.json"):
        main([str(tmp_path / "nothing")])
