"""The unbiased pass@k estimator of Chen et al. 2021 (arXiv 2107.03374, §2.1).

With n samples of a problem of which c pass, pass@k = 1 - C(n-c, k) / C(n, k): the chance that k samples drawn
without replacement from the n contain at least one that passes. It is computed as the product
1 - prod_{i=n-c+1..n} (1 - k/i), which never forms the huge binomials. When n - c < k every draw of k holds a
passing sample, so the value is 1; c = 0 gives 0; k > n is undefined (the benchmark reports only k <= n).

    pass_at_k(n=10, c=3, k=1)                      # 0.3
    mean_pass_at_k([(10, 3), (10, 0)], k=5)        # averaged over problems
"""

from __future__ import annotations

from collections.abc import Iterable


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with `n` samples, `c` of them correct."""
    if not 0 <= c <= n or k < 1:
        raise ValueError(f"pass@k needs 0 <= c <= n and k >= 1, got n={n} c={c} k={k}")
    if k > n:
        raise ValueError(f"pass@{k} is undefined with only n={n} samples")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def mean_pass_at_k(counts: Iterable[tuple[int, int]], k: int) -> float:
    """pass@k averaged over problems given as (n, c) pairs."""
    values = [pass_at_k(n, c, k) for n, c in counts]
    return sum(values) / len(values) if values else 0.0


def reportable_ks(n_min: int, ks: Iterable[int] = (1, 10, 100)) -> list[int]:
    """The k values that every problem's sample count allows."""
    return [k for k in ks if k <= n_min]
