"""Speedup intervals and the repeat rule (pure functions, synthetic timings)."""

from __future__ import annotations

import math
import random

import pytest
from kernelharness.stats import (
    SpeedupEstimate,
    clears,
    iqr,
    judged_faster,
    order_statistic_ranks,
    run_repeats,
    settled,
    speedup_interval,
)


def test_order_statistic_ranks_cover_the_median():
    lo, hi = order_statistic_ranks(50, 0.95)
    assert (lo, hi) == (18, 33)  # the textbook sign-test interval for n = 50
    lo99, hi99 = order_statistic_ranks(50, 0.99)
    assert lo99 < lo and hi99 > hi
    assert order_statistic_ranks(5, 0.95) is None  # too few trials to say anything


def test_interval_brackets_the_ratio_of_medians():
    ref = [2.0 + 0.01 * i for i in range(40)]
    cand = [1.0 + 0.005 * i for i in range(40)]
    est = speedup_interval(ref, cand, 0.99, 0.0)
    assert est.low <= est.speedup <= est.high
    median_ref = (ref[19] + ref[20]) / 2
    median_cand = (cand[19] + cand[20]) / 2
    assert est.speedup == pytest.approx(median_ref / median_cand)
    wider = speedup_interval(ref, cand, 0.99, 0.01)
    assert wider.low == pytest.approx(est.low / 1.01)
    assert wider.high == pytest.approx(est.high * 1.01)


def test_too_few_trials_never_decide():
    est = speedup_interval([2.0, 2.0, 2.0], [1.0, 1.0, 1.0], 0.99, 0.0)
    assert est.low == 0.0 and math.isinf(est.high)
    assert not judged_faster(est, 1.0)


def test_clears_and_settled():
    est = SpeedupEstimate(1.8, 1.6, 2.1)
    assert clears(est, 1.5) and clears(est, 2.5) and not clears(est, 2.0)
    assert settled(est, [1.5, 2.5]) and not settled(est, [1.5, 2.0, 2.5])


def _fake_measure(true_speedup: float, noise: float, seed: int, trials: int = 50):
    rng = random.Random(seed)
    calls = []

    def measure(repeat: int):
        calls.append(repeat)
        ref = [1.0 * math.exp(rng.gauss(0, noise)) for _ in range(trials)]
        cand = [1.0 / true_speedup * math.exp(rng.gauss(0, noise)) for _ in range(trials)]
        return ref, cand

    return measure, calls


def test_repeat_rule_stops_once_every_threshold_is_cleared():
    measure, calls = _fake_measure(true_speedup=3.0, noise=0.02, seed=1)
    records, pooled = run_repeats(measure, 5, [1.5, 2.0, 2.5], 0.99, 0.002)
    assert calls == [0] and len(records) == 1
    assert pooled.low > 2.5


def test_repeat_rule_runs_every_repeat_when_undecided():
    # a speedup of exactly one threshold can never be settled: all repeats, all recorded
    measure, calls = _fake_measure(true_speedup=2.0, noise=0.05, seed=2)
    records, pooled = run_repeats(measure, 5, [1.5, 2.0, 2.5], 0.99, 0.002)
    assert calls == [0, 1, 2, 3, 4] and len(records) == 5
    assert pooled.low < 2.0 < pooled.high
    assert all(set(r) >= {"ref_ms", "cand_ms", "speedup", "low", "high"} for r in records)


def test_repeat_rule_pools_trials():
    measure, _calls = _fake_measure(true_speedup=2.0, noise=0.05, seed=3)
    records, pooled = run_repeats(measure, 4, [2.0], 0.99, 0.0)
    single_widths = [r["high"] / r["low"] for r in records]
    assert pooled.high / pooled.low < min(single_widths)  # more trials, narrower interval


def test_unchanged_kernel_rarely_judged_faster():
    # calibration on synthetic noise: the one-sided error stays below 1%
    faster = 0
    for seed in range(400):
        measure, _ = _fake_measure(true_speedup=1.0, noise=0.03, seed=100 + seed)
        _records, pooled = run_repeats(measure, 1, [1.0], 0.99, 0.002)
        faster += judged_faster(pooled, 1.0)
    assert faster <= 4


def test_iqr():
    assert iqr([1.0, 2.0, 3.0, 4.0, 5.0]) == pytest.approx(2.0)
    assert iqr([7.0]) == 0.0
