"""`glmstack ablate`: the GLM-4.5 / GLM-5 reports' design claims as small declarative experiments.

A claim (claims/<name>.py) = arms (recipe stages with overrides, trained by the one loop), a measure function and
checks; runner.py runs arms interleaved by seed and stores each (claim, arm, seed) atomically (a rerun resumes);
stats.py gives paired 95% t-intervals and verdicts; report.py writes ablations.md, plots and results.json.
docs/ablations.md holds the table this repository's commit produced, with its command.
"""
