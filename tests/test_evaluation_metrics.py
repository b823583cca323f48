"""KernelBench metrics on hand-built result tables with known answers: Exec, fast_p as the
paper computes it (point speedup > p) and as the harness decides it (interval above p),
both tolerance protocols, plain and robust verdicts, pass@k, reference failures."""

from __future__ import annotations

import math

import pytest
from dicepipe.evaluation.metrics import pass_at_k, summarize
from kernelharness.results import FLAG_COLUMNS
from dicepipe.judgement import named_protocol

PROFILES = [named_protocol("kernelbench"), named_protocol("kernelbench_v0")]


def result(correct=True, tol=0.0, median=None, low=None, flags=(), launch_bound=False,
           compiled=True):
    row = {name: name in flags for name in FLAG_COLUMNS}
    row.update(compiled=compiled, correct=correct and compiled, tolerance_needed=tol if correct else None,
               output_precision="fp32", speedup_median=median, speedup_low=low,
               launch_bound=launch_bound,
               # KernelBench's own trials agree with the strict check in these rows
               kb_trial_tolerance=[tol] * 5 if correct else [math.inf])
    return row


def record(task, level, res, sample=0, reference_ok=True):
    return {"task_id": task, "level": level, "problem_id": int(task[1:]), "name": task,
            "sample": sample, "reference_ok": reference_ok, "has_code": res is not None,
            "result": res}


TABLE = [
    # level 1: one clean 1.5x kernel; one 2.5x kernel needing 5e-3 (v0 only) and flagged;
    # one wrong kernel; one generation without code
    record("t1", 1, result(tol=1e-6, median=1.5, low=1.2)),
    record("t2", 1, result(tol=5e-3, median=2.5, low=2.1, flags=("flag_no_kernel",))),
    record("t3", 1, result(correct=False)),
    record("t4", 1, None),
    # level 2: point speedup above 1 but its interval is not; a launch-bound reference;
    # a task whose reference fails (its correct kernel must not count)
    record("t5", 2, result(tol=0.0, median=1.05, low=0.98, launch_bound=True)),
    record("t6", 2, result(tol=0.0, median=3.0, low=2.9), reference_ok=False),
]


def _rows():
    return {row["level"]: row for row in summarize(TABLE, "model", PROFILES, [1.0, 2.0], [1])}


def test_exec_and_fast_p_per_level_under_the_kernelbench_profile():
    rows = _rows()
    one, two, every = rows["1"], rows["2"], rows["all"]
    assert (one["tasks"], one["reference_failed"]) == (4, 0)
    assert (two["tasks"], two["reference_failed"]) == (1, 1)
    assert (every["tasks"], every["reference_failed"]) == (5, 1)
    assert one["kernelbench.plain.exec"] == 0.25  # t2 needs 5e-3 > 1e-4
    assert one["kernelbench.plain.fast_1_point"] == 0.25
    assert one["kernelbench.plain.fast_2_point"] == 0.0
    assert two["kernelbench.plain.exec"] == 1.0
    assert two["kernelbench.plain.fast_1_point"] == 1.0  # 1.05 > 1 (the paper's count)
    assert two["kernelbench.plain.fast_1_interval"] == 0.0  # 0.98 is not above 1
    assert every["kernelbench.plain.exec"] == 0.4
    assert every["kernelbench.plain.fast_1_point"] == 0.4
    assert every["kernelbench.plain.fast_1_interval"] == 0.2
    assert every["kernelbench.plain.geomean_speedup"] == pytest.approx(math.sqrt(1.5 * 1.05), abs=1e-6)
    assert two["kernelbench.plain.launch_bound_share"] == 1.0
    assert one["kernelbench.plain.launch_bound_share"] == 0.0
    assert every["kernelbench.plain.launch_bound_share"] == 0.5
    assert one["with_code"] == 0.75 and one["compiled"] == 0.75


def test_the_v0_profile_and_the_robust_verdict():
    one = _rows()["1"]
    assert one["kernelbench_v0.plain.exec"] == 0.5
    assert one["kernelbench_v0.plain.fast_2_point"] == 0.25
    assert one["kernelbench_v0.plain.fast_2_interval"] == 0.25  # low 2.1 > 2
    assert one["kernelbench_v0.robust.exec"] == 0.25  # t2 has no kernel of its own
    assert one["kernelbench_v0.robust.fast_2_point"] == 0.0
    assert one["kernelbench.robust.exec"] == 0.25


def test_fast_p_is_strictly_greater():
    table = [record("t1", 1, result(median=2.0, low=2.0)), record("t2", 1, result(median=1.0, low=1.0))]
    row = summarize(table, "m", PROFILES[:1], [1.0, 2.0], [1])[0]
    assert row["kernelbench.plain.exec"] == 1.0
    assert row["kernelbench.plain.fast_1_point"] == 0.5
    assert row["kernelbench.plain.fast_2_point"] == 0.0
    assert row["kernelbench.plain.fast_2_interval"] == 0.0


def test_pass_at_k_unbiased_estimator():
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)
    assert pass_at_k(5, 0, 3) == 0.0
    assert pass_at_k(4, 3, 2) == 1.0  # every pair holds a correct sample
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def test_several_samples_average_exec_and_give_pass_at_k():
    table = [record("t1", 1, result(median=1.5, low=1.2), sample=0),
             record("t1", 1, result(correct=False), sample=1),
             record("t2", 1, None, sample=0),
             record("t2", 1, result(correct=False), sample=1)]
    row = summarize(table, "m", PROFILES[:1], [1.0], [1, 2, 3])[0]
    assert row["samples_per_task"] == 2
    assert row["kernelbench.plain.exec"] == 0.25
    assert row["kernelbench.plain.pass_at_1"] == 0.25
    assert row["kernelbench.plain.pass_at_2"] == 0.5
    assert row["kernelbench.plain.pass_at_3"] is None  # not enough samples


def test_a_reference_that_disagrees_with_itself_under_one_protocol_limits_that_one_only():
    """The reference's check against a copy of itself is judged per protocol: a reference
    whose answers change with the input distribution fails the strict check, not
    KernelBench's; the task leaves the strict denominators only and is reported."""
    limited = record("t1", 1, result(tol=0.0, median=1.5, low=1.2))
    limited["reference_check"] = {"compiled": True, "correct": False, "tolerance_needed": None,
                                  "output_precision": "fp32", "kb_trial_tolerance": [0.0] * 5}
    clean = record("t2", 1, result(correct=False))
    clean["reference_check"] = {"compiled": True, "correct": True, "tolerance_needed": 0.0,
                                "output_precision": "fp32", "kb_trial_tolerance": [0.0] * 5}
    strict = named_protocol("strict")
    row = summarize([limited, clean], "model", PROFILES + [strict], [1.0], [1])[-1]
    assert row["reference_failed"] == 0
    assert row["strict.reference_limited"] == 1 and row["kernelbench.reference_limited"] == 0
    assert row["kernelbench.plain.exec"] == 0.5  # t1 right, t2 wrong: both tasks count
    assert row["strict.plain.exec"] == 0.0  # only t2 is judged by the strict check
