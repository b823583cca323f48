"""Speedup estimates, their intervals and the repeat rule (pure functions).

Reference and candidate are timed in pairs (same trial, same inputs, a balanced random
order), so each trial gives one ratio ref/cand. The speedup is the ratio of the two medians;
its interval is the distribution-free one for the median of the paired ratios (order
statistics, from the binomial distribution of the sign test), widened by a relative noise
floor that stands for what trial-to-trial scatter cannot show (clock and placement effects
common to a whole run).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import median


@dataclass(frozen=True)
class SpeedupEstimate:
    speedup: float
    low: float
    high: float


def order_statistic_ranks(n: int, confidence: float) -> tuple[int, int] | None:
    """1-based ranks (lo, hi) with P(x_(lo) <= median <= x_(hi)) >= confidence, or None.

    The largest k with P(B <= k-1) <= (1-confidence)/2 for B ~ Binomial(n, 1/2), exactly
    (integer arithmetic; the cumulative sum is built once).
    """
    alpha_half = (1.0 - confidence) / 2.0
    scale = 2**n
    cumulative = 0  # sum of C(n, i) for i < k
    best = None
    for k in range(1, n // 2 + 1):
        cumulative += math.comb(n, k - 1)
        if cumulative / scale <= alpha_half:
            best = k
        else:
            break
    if best is None:
        return None
    return best, n - best + 1


def speedup_interval(ref_ms: Sequence[float], cand_ms: Sequence[float], confidence: float,
                     noise_floor: float) -> SpeedupEstimate:
    if len(ref_ms) != len(cand_ms) or not ref_ms:
        raise ValueError("paired timings must be non-empty and of equal length")
    point = median(ref_ms) / median(cand_ms)
    ratios = sorted(r / c for r, c in zip(ref_ms, cand_ms))
    ranks = order_statistic_ranks(len(ratios), confidence)
    if ranks is None:  # too few trials for this confidence: no information
        return SpeedupEstimate(point, 0.0, math.inf)
    low = min(ratios[ranks[0] - 1], point) / (1.0 + noise_floor)
    high = max(ratios[ranks[1] - 1], point) * (1.0 + noise_floor)
    return SpeedupEstimate(point, low, high)


def clears(estimate: SpeedupEstimate, threshold: float) -> bool:
    """True when the interval lies wholly on one side of `threshold`."""
    return estimate.low > threshold or estimate.high < threshold


def settled(estimate: SpeedupEstimate, thresholds: Sequence[float]) -> bool:
    """The repeat rule: stop once every decision threshold is cleared."""
    return all(clears(estimate, p) for p in thresholds)


def judged_faster(estimate: SpeedupEstimate, threshold: float) -> bool:
    """Faster with confidence: the interval's lower end strictly above `threshold` (the
    pipeline's verdict asks the same of a row's speedup_low)."""
    return estimate.low > threshold


def iqr(values: Sequence[float]) -> float:
    if len(values) < 2:
        return 0.0
    ordered = sorted(values)
    return _quantile(ordered, 0.75) - _quantile(ordered, 0.25)


def _quantile(ordered: Sequence[float], q: float) -> float:
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def run_repeats(measure, repeats: int, thresholds: Sequence[float], confidence: float,
                noise_floor: float) -> tuple[list[dict], SpeedupEstimate]:
    """Measure up to `repeats` times, pooling trials, stopping once the interval settles.

    `measure(r)` returns (ref_ms, cand_ms) for repeat r. Every repeat is recorded, with its
    own estimate; the returned estimate pools every trial measured. The pooled interval is
    looked at after every repeat, so each look gets 1/repeats of the error budget
    (Bonferroni): an unchanged kernel is then judged faster in at most (1 - confidence) / 2
    of measurements however many repeats it takes, not up to `repeats` times that.
    """
    look_confidence = 1.0 - (1.0 - confidence) / repeats
    records: list[dict] = []
    pooled_ref: list[float] = []
    pooled_cand: list[float] = []
    pooled = None
    for r in range(repeats):
        ref_ms, cand_ms = measure(r)
        own = speedup_interval(ref_ms, cand_ms, confidence, noise_floor)
        records.append({"ref_ms": median(ref_ms), "cand_ms": median(cand_ms),
                        "ref_iqr_ms": iqr(ref_ms), "cand_iqr_ms": iqr(cand_ms),
                        "speedup": own.speedup, "low": own.low, "high": own.high})
        pooled_ref += list(ref_ms)
        pooled_cand += list(cand_ms)
        pooled = speedup_interval(pooled_ref, pooled_cand, look_confidence, noise_floor)
        if settled(pooled, thresholds):
            break
    return records, pooled
