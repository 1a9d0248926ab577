"""Quality buckets and epoch multipliers: equal-sized buckets, expected copies, zero means none, reproducible."""

import numpy as np

from glmstack.data.mixture import MixtureConfig, assign_levels, n_copies, percentile_buckets


def test_buckets_equal_sized_within_one():
    scores = np.random.default_rng(0).random(1003)
    counts = np.bincount(percentile_buckets(scores, 20), minlength=20)
    assert counts.max() - counts.min() <= 1


def test_levels_are_per_source_and_monotone():
    cfg = MixtureConfig()
    sources = ["a"] * 100 + ["b"] * 100
    scores = list(np.linspace(0, 1, 100)) + list(np.linspace(100, 200, 100))  # b's scale differs
    levels = assign_levels(sources, scores, cfg)
    assert levels[:100] == levels[100:]  # percentiles are per source
    assert levels[:100] == sorted(levels[:100]) and levels[0] == 0 and levels[99] == 4
    assert assign_levels(["a"], [None], cfg) == [None]


def test_copies_expectation_and_zero():
    for e in (0.5, 1.0, 2.0, 3.2):
        copies = [n_copies(f"d{i}", e, seed=0) for i in range(5000)]
        assert abs(np.mean(copies) - e) < 3 * np.sqrt(0.25 / 5000) + 1e-9
        assert set(copies) <= {int(e), int(e) + 1}
    assert all(n_copies(f"d{i}", 0.0, seed=0) == 0 for i in range(100))
    assert [n_copies(f"d{i}", 3.2, 7) for i in range(50)] == [n_copies(f"d{i}", 3.2, 7) for i in range(50)]
