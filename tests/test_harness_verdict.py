"""The one verdict function on hand-built rows: profiles, robustness, both speed statistics."""

from __future__ import annotations

import math

import pytest
from dicepipe.errors import HarnessError
from dicepipe.harness.verdict import (
    is_correct,
    is_faster,
    judge,
    tolerance_profile,
    verdict,
)

KB = tolerance_profile("kernelbench")
V0 = tolerance_profile("kernelbench_v0")


def _row(**over):
    row = {"compiled": True, "correct": True, "correct_robust": True, "tolerance_needed": 0.0,
           "output_precision": "fp32", "speedup_median": 2.5, "speedup_low": 2.2,
           "flag_no_kernel": False, "flag_output_cached": False}
    row.update(over)
    return row


@pytest.mark.parametrize("needed, precision, strict, loose", [
    (5e-5, "fp32", True, True),
    (1e-4, "fp32", True, True),        # at the tolerance passes, as allclose does
    (2e-3, "fp32", False, True),       # a TF32 kernel: only the v0 profile accepts it
    (2e-3, "low_precision", True, True),
    (0.02, "low_precision", False, False),
    (0.0, "exact", True, True),
    (math.inf, "exact", False, False),
    (None, "fp32", False, False),      # never produced comparable output
])
def test_profiles_judge_the_recorded_tolerance(needed, precision, strict, loose):
    row = _row(tolerance_needed=needed, output_precision=precision)
    assert is_correct(row, KB, robust=True) is strict
    assert is_correct(row, V0, robust=True) is loose


def test_harness_failures_stay_failures_under_any_profile():
    assert judge(None, profile=V0, robust=False) == "not_measured"
    assert judge(_row(compiled=False), profile=V0, robust=False) == "not_compiled"
    # e.g. an output served from a cache during timing: `correct` is False whatever the tolerance
    assert judge(_row(correct=False), profile=V0, robust=False) == "incorrect"


def test_robust_means_no_flag():
    flagged = _row(flag_output_cached=True, correct_robust=False)
    assert verdict(flagged, profile=KB, robust=False)
    assert judge(flagged, profile=KB, robust=True) == "flagged"
    # summaries without flag columns fall back to their stored robust verdict
    summary = {"compiled": True, "correct": True, "correct_robust": False}
    assert judge(summary, profile=KB, robust=True) == "flagged"
    assert judge(summary, profile=KB, robust=False) == "accepted"


def test_speed_statistics_compare_strictly():
    row = _row(speedup_median=2.0, speedup_low=1.8)
    assert not is_faster(row, 2.0, "median") and is_faster(row, 1.99, "median")
    assert not is_faster(row, 1.8, "low") and is_faster(row, 1.79, "low")
    assert judge(row, profile=KB, robust=True, threshold=2.0, statistic="median") == "below_threshold"
    assert judge(_row(speedup_low=None), profile=KB, robust=True, threshold=1.0) == "no_speedup"
    assert judge(_row(speedup_low=float("nan")), profile=KB, robust=True,
                 threshold=1.0) == "no_speedup"
    assert verdict(_row(), profile=KB, robust=True, threshold=2.0)  # low 2.2 > 2


def test_bad_names_say_what_exists():
    with pytest.raises(HarnessError, match="kernelbench_v0"):
        tolerance_profile("v0")
    with pytest.raises(HarnessError, match="statistic"):
        is_faster(_row(), 1.0, "mean")
    custom = tolerance_profile("mine", {"mine": {"fp32": 1e-3, "low_precision": 5e-2}})
    assert custom.allowed("fp32") == 1e-3 and custom.allowed("exact") == 0.0
