"""The verdict rule, attempt rows and the report: pure functions over plain rows."""

from __future__ import annotations

import pyarrow as pa
from dicepipe.augment.records import (
    ATTEMPT_SCHEMA,
    attempt_row,
    build_report,
    classify,
    task_reason,
)
from dicepipe.augment.shapes import BlockShape
from dicepipe.augment.tasks import Task
from dicepipe.judgement import named_protocol

KB = named_protocol("strict")  # assemble's and augment's default

GOOD = {"compiled": True, "correct": True, "correct_robust": True, "speedup_median": 1.3,
        "speedup_low": 1.1, "speedup_high": 1.5, "error": None}


def _task(name: str, family: str = "mha") -> Task:
    return Task(name, family, "cfg", "cpu", 3, BlockShape(1, 8, 64, 128, 2, 2, 32), "code")


def test_classify_follows_the_verdict_order():
    kw = {"threshold": 1.0, "statistic": "low", "robust": True, "protocol": KB}
    assert classify(GOOD, **kw) == "accepted"
    assert classify({**GOOD, "compiled": False, "correct": False}, **kw) == "not_compiled"
    assert classify({**GOOD, "correct": False}, **kw) == "incorrect"
    assert classify({**GOOD, "correct_robust": False}, **kw) == "flagged"
    assert classify({**GOOD, "correct_robust": False}, **{**kw, "robust": False}) == "accepted"
    assert classify({**GOOD, "speedup_low": None}, **kw) == "no_speedup"
    assert classify({**GOOD, "speedup_low": float("nan")}, **kw) == "no_speedup"


def test_lower_bound_is_stricter_than_the_median():
    noisy = {**GOOD, "speedup_median": 1.05, "speedup_low": 0.97}
    kw = {"robust": True, "protocol": KB}
    assert classify(noisy, threshold=1.0, statistic="low", **kw) == "below_threshold"
    assert classify(noisy, threshold=1.0, statistic="median", **kw) == "accepted"
    assert classify(GOOD, threshold=1.1, statistic="low", **kw) == "below_threshold"  # strictly above
    assert classify(GOOD, threshold=1.09, statistic="low", **kw) == "accepted"


def test_task_reason_reports_the_most_promising_failure():
    assert task_reason([{"reason": "author_timeout"}, {"reason": "incorrect"}]) == "incorrect"
    assert task_reason([{"reason": "not_compiled"}, {"reason": "below_threshold"}]) == "below_threshold"
    assert task_reason([{"reason": "below_threshold"}, {"reason": "accepted"}]) == "accepted"
    assert task_reason([]) == "no_candidate"


def test_rows_fit_the_schema_and_report_counts():
    a, b, c = _task("a"), _task("b"), _task("c", "mlp_plain")
    rows = [
        attempt_row(a, 0, "templates", job_id="a0", result={**GOOD, "speedup_low": 0.9},
                    reason="below_threshold"),
        attempt_row(a, 1, "templates", job_id="a1", result=GOOD, reason="accepted"),
        attempt_row(b, 0, "endpoint", reason="author_timeout", detail="no answer"),
        attempt_row(b, 1, "endpoint", job_id="b1",
                    result={"compiled": False, "error": "boom"}, reason="not_compiled"),
    ]
    table = pa.Table.from_pylist(rows, schema=ATTEMPT_SCHEMA)
    assert table.num_rows == 4
    assert rows[2]["job_id"] is None and rows[2]["compiled"] is False
    assert rows[3]["detail"] == "boom"
    report = build_report([a, b, c], rows, {"corpus": "x"})
    assert report["tasks"] == 3 and report["tasks_with_sample"] == 1
    assert report["attempts_by_reason"] == {"accepted": 1, "author_timeout": 1,
                                            "below_threshold": 1, "not_compiled": 1}
    assert report["tasks_without_sample_by_reason"] == {"no_candidate": 1, "not_compiled": 1}
    assert report["families"]["mha"] == {"tasks": 2, "with_sample": 1}
    assert report["kept_speedup"]["median"] == 1.3
