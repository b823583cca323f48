"""The one verdict function on hand-built rows: protocols, robustness, both speed statistics."""

from __future__ import annotations

import math

import pytest
from dicepipe.errors import HarnessError
from dicepipe.judgement import (
    is_correct,
    is_faster,
    judge,
    named_protocol,
    verdict,
)

from dicepipe.judgement import Protocol

# the strict check at KernelBench main's tolerances, and the same check at 1e-2
KB = named_protocol("strict")
V0 = Protocol("strict_v0", "strict", 1e-2, 1e-2)


def _row(**over):
    row = {"compiled": True, "correct": True, "correct_robust": True, "tolerance_needed": 0.0,
           "output_precision": "fp32", "speedup_median": 2.5, "speedup_low": 2.2,
           "flag_no_kernel": False, "flag_output_cached": False}
    row.update(over)
    return row


@pytest.mark.parametrize("needed, precision, strict, loose", [
    (5e-5, "fp32", True, True),
    (1e-4, "fp32", True, True),        # at the tolerance passes, as allclose does
    (2e-3, "fp32", False, True),       # a TF32 kernel: only the v0 protocol accepts it
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
    assert judge(None, protocol=V0, robust=False) == "not_measured"
    assert judge(_row(compiled=False), protocol=V0, robust=False) == "not_compiled"
    # e.g. an output served from a cache during timing: `correct` is False whatever the tolerance
    assert judge(_row(correct=False), protocol=V0, robust=False) == "incorrect"


def test_robust_means_no_flag():
    flagged = _row(flag_output_cached=True, correct_robust=False)
    assert verdict(flagged, protocol=KB, robust=False)
    assert judge(flagged, protocol=KB, robust=True) == "flagged"
    # summaries without flag columns fall back to their stored robust verdict
    summary = {"compiled": True, "correct": True, "correct_robust": False}
    assert judge(summary, protocol=KB, robust=True) == "flagged"
    assert judge(summary, protocol=KB, robust=False) == "accepted"


def test_speed_statistics_compare_strictly():
    row = _row(speedup_median=2.0, speedup_low=1.8)
    assert not is_faster(row, 2.0, "median") and is_faster(row, 1.99, "median")
    assert not is_faster(row, 1.8, "low") and is_faster(row, 1.79, "low")
    assert judge(row, protocol=KB, robust=True, threshold=2.0, statistic="median") == "below_threshold"
    assert judge(_row(speedup_low=None), protocol=KB, robust=True, threshold=1.0) == "no_speedup"
    assert judge(_row(speedup_low=float("nan")), protocol=KB, robust=True,
                 threshold=1.0) == "no_speedup"
    assert verdict(_row(), protocol=KB, robust=True, threshold=2.0)  # low 2.2 > 2


def test_bad_names_say_what_exists():
    with pytest.raises(HarnessError, match="kernelbench_v0"):
        named_protocol("v0")
    with pytest.raises(HarnessError, match="statistic"):
        is_faster(_row(), 1.0, "mean")
    custom = named_protocol("mine", {"mine": {"check": "strict", "fp32": 1e-3,
                                              "low_precision": 5e-2}})
    assert custom.allowed("fp32") == 1e-3 and custom.allowed("exact") == 0.0


def _kb_row(trials, precision="fp32", **over):
    row = _row(correct=False, tolerance_needed=math.inf, output_precision=precision,
               kb_trial_tolerance=trials)
    row.update(over)
    return row


@pytest.mark.parametrize("trials, kernelbench, v0, reward", [
    ([0.0] * 5, True, True, True),
    ([5e-5, 1e-4, 0.0, 0.0, 0.0], True, True, True),   # at the tolerance passes, as allclose
    ([2e-3] * 5, False, True, True),                    # a TF32 kernel
    ([0.0, 0.0, 0.0, 0.0, 0.02], False, False, True),   # the release's reward sees trial 1
    ([0.02, 0.0, 0.0, 0.0, 0.0], False, False, False),
    ([0.0, math.inf], False, False, True),              # ended early (shape, error): 2 of 5
    ([], False, False, False),                          # never ran (build failed)
])
def test_kernelbench_protocols_judge_kernelbench_trials_only(trials, kernelbench, v0, reward):
    """The kernelbench check reads KernelBench's trials alone: a row that failed the strict
    check (varied inputs) is still judged by the benchmark's protocol."""
    row = _kb_row(trials)
    assert is_correct(row, named_protocol("kernelbench"), robust=False) is kernelbench
    assert is_correct(row, named_protocol("kernelbench_v0"), robust=False) is v0
    assert is_correct(row, named_protocol("release_reward"), robust=False) is reward
    assert not is_correct(row, named_protocol("strict"), robust=False)


def test_kernelbench_protocol_tolerance_follows_output_precision_and_flags_stay_an_axis():
    row = _kb_row([5e-3] * 5, precision="low_precision")
    assert is_correct(row, named_protocol("kernelbench"), robust=False)
    assert not is_correct(_kb_row([5e-3] * 5), named_protocol("kernelbench"), robust=False)
    flagged = _kb_row([0.0] * 5, flag_no_kernel=True)
    assert judge(flagged, protocol=named_protocol("kernelbench_v0"), robust=False) == "accepted"
    assert judge(flagged, protocol=named_protocol("kernelbench_v0"), robust=True) == "flagged"
    assert judge(_kb_row([0.0] * 5, compiled=False), protocol=named_protocol("kernelbench"),
                 robust=False) == "not_compiled"


def test_protocol_definitions_are_checked():
    with pytest.raises(HarnessError, match="trials"):
        named_protocol("x", {"x": {"check": "kernelbench", "fp32": 1e-2, "low_precision": 1e-2}})
    with pytest.raises(HarnessError, match="check"):
        named_protocol("x", {"x": {"check": "allclose", "fp32": 1e-2, "low_precision": 1e-2}})
