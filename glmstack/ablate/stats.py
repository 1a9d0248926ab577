"""Effects, 95% t-intervals over seeds and verdicts for `glmstack ablate` (no SciPy needed).

A check compares a treatment arm with a control arm seed by seed: the effect of seed s is
`treatment[s] - control[s]` (paired: both arms saw the same seed's initialisation and data), and the interval is
the Student-t interval of the mean paired difference over the seeds. A check on one arm alone (`kind="above"`)
uses the arm's values. Verdicts, with d = the interval signed so that positive means "as the paper says":

  better     reproduced if the whole interval is > 0; not reproduced if it is wholly <= margin (no useful gain
             or a loss); else inconclusive.
  no_worse   (the paper says "without hurting" / "at least as well") reproduced if the whole interval is above
             -margin; not reproduced if it is wholly below -margin; else inconclusive.
  above      reproduced if the whole interval of the value is above `margin`; not reproduced if wholly below.
"""

from __future__ import annotations

import math
import statistics

# two-sided 95% Student-t quantiles t_{0.975, df}, df = 1..30 (beyond: the normal 1.96 is within 2%)
T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


def t_interval(values: list[float]) -> tuple[float, float, float]:
    """(mean, low, high): the 95% t-interval of the mean; a single value has an infinite interval."""
    n = len(values)
    mean = statistics.fmean(values)
    if n < 2:
        return mean, -math.inf, math.inf
    t = T975[n - 2] if n - 1 <= len(T975) else 1.96
    half = t * statistics.stdev(values) / math.sqrt(n)
    return mean, mean - half, mean + half


def verdict(kind: str, better: str, low: float, high: float, margin: float = 0.0) -> str:
    """'reproduced' | 'not reproduced' | 'inconclusive' for an interval [low, high] of the effect (module doc)."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return "inconclusive"
    if kind == "above":
        lo, hi = (low, high) if better == "higher" else (-high, -low)
        m = margin if better == "higher" else -margin
        return "reproduced" if lo > m else "not reproduced" if hi < m else "inconclusive"
    lo, hi = (low, high) if better == "higher" else (-high, -low)  # positive = the paper's direction
    if kind == "better":
        return "reproduced" if lo > 0 else "not reproduced" if hi <= margin else "inconclusive"
    if kind == "no_worse":
        return "reproduced" if lo > -margin else "not reproduced" if hi < -margin else "inconclusive"
    raise ValueError(f"unknown check kind {kind!r}")
