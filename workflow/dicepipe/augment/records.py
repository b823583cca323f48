"""What the augment stage records: one row per attempt, the verdict rule that keeps a
candidate, and the report's counts. Pure functions over plain rows.

Verdict (dicepipe/judgement.py). A candidate is kept when it compiled, is correct under
`augment.protocol` (the robust verdict when augment.robust is set: no deception flag), and
its speedup statistic is above `augment.speedup_threshold`. The statistic is `augment.speedup_statistic`: `low` (default)
is the lower end of the harness's speedup interval, so a kept sample is faster with the
harness's confidence and not merely on a lucky median (near 1.0x a median is a coin flip);
`median` is the ratio of median runtimes. `reported_speedup` is always the median."""

from __future__ import annotations

import math
import statistics
from collections import Counter

import pyarrow as pa

from ..judgement import Protocol, judge

ATTEMPT_SCHEMA = pa.schema([
    pa.field("task_id", pa.string(), nullable=False),
    pa.field("family", pa.string(), nullable=False),
    pa.field("shape", pa.string(), nullable=False),  # JSON of the dims the program uses
    pa.field("attempt", pa.int32(), nullable=False),
    pa.field("author", pa.string(), nullable=False),
    pa.field("job_id", pa.string()),  # harness job; null when the author gave no file
    pa.field("compiled", pa.bool_(), nullable=False),
    pa.field("correct", pa.bool_(), nullable=False),
    pa.field("correct_robust", pa.bool_(), nullable=False),
    pa.field("speedup", pa.float64()),  # ratio of median runtimes (reference / candidate)
    pa.field("speedup_low", pa.float64()),
    pa.field("speedup_high", pa.float64()),
    pa.field("kept", pa.bool_(), nullable=False),
    pa.field("reason", pa.string(), nullable=False),  # "accepted" or why not (see classify)
    pa.field("detail", pa.string()),  # author failure note or the harness's error
])

# An attempt's reason is the harness verdict's (judgement.REASONS: "accepted" or why
# not), or an author failure (authors.AUTHOR_FAILURES) when there was no file to judge. A task
# without a sample is reported under the most promising reason among its attempts.
_TASK_REASON_ORDER = ("below_threshold", "no_speedup", "flagged", "incorrect", "not_compiled",
                      "not_measured", "author_no_code", "author_bad_response",
                      "author_http_error", "author_timeout", "author_unreachable")


def _number(value) -> float | None:
    if value is None:
        return None
    value = float(value)
    return None if math.isnan(value) else value


def classify(result: dict, *, threshold: float, statistic: str, robust: bool,
             protocol: Protocol) -> str:
    """'accepted' or the reason a harness result row does not yield a sample (the harness
    verdict's own words)."""
    return judge(result, protocol=protocol, robust=robust, threshold=threshold,
                 statistic=statistic)


def attempt_row(task, attempt: int, author: str, *, job_id=None, result=None, reason: str,
                detail: str | None = None) -> dict:
    result = result or {}
    return {
        "task_id": task.task_id,
        "family": task.family,
        "shape": task.shape_json,
        "attempt": attempt,
        "author": author,
        "job_id": job_id,
        "compiled": bool(result.get("compiled", False)),
        "correct": bool(result.get("correct", False)),
        "correct_robust": bool(result.get("correct_robust", False)),
        "speedup": _number(result.get("speedup_median")),
        "speedup_low": _number(result.get("speedup_low")),
        "speedup_high": _number(result.get("speedup_high")),
        "kept": reason == "accepted",
        "reason": reason,
        "detail": detail if detail is not None else (result.get("error") or None),
    }


def task_reason(rows: list[dict]) -> str:
    """Outcome of one task from its attempt rows."""
    reasons = {row["reason"] for row in rows}
    if "accepted" in reasons:
        return "accepted"
    for reason in _TASK_REASON_ORDER:
        if reason in reasons:
            return reason
    return min(reasons) if reasons else "no_candidate"


def build_report(tasks, attempt_rows: list[dict], header: dict) -> dict:
    by_task: dict[str, list[dict]] = {task.task_id: [] for task in tasks}
    for row in attempt_rows:
        by_task[row["task_id"]].append(row)
    outcomes = {task_id: task_reason(rows) for task_id, rows in by_task.items()}
    families: dict[str, dict] = {}
    for task in tasks:
        entry = families.setdefault(task.family, {"tasks": 0, "with_sample": 0})
        entry["tasks"] += 1
        entry["with_sample"] += outcomes[task.task_id] == "accepted"
    kept = [row["speedup"] for row in attempt_rows if row["kept"] and row["speedup"] is not None]
    return {
        **header,
        "tasks": len(tasks),
        "tasks_with_sample": sum(1 for reason in outcomes.values() if reason == "accepted"),
        "attempts": len(attempt_rows),
        "attempts_by_reason": dict(sorted(Counter(r["reason"] for r in attempt_rows).items())),
        "tasks_without_sample_by_reason": dict(sorted(
            Counter(reason for reason in outcomes.values() if reason != "accepted").items())),
        "families": dict(sorted(families.items())),
        "kept_speedup": {
            "min": round(min(kept), 4), "median": round(statistics.median(kept), 4),
            "max": round(max(kept), 4)} if kept else None,
    }
