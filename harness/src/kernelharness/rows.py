"""Turning what the stages of one job produced into its result row."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .results import DYNAMIC_FLAGS, empty_row, finish_row, tail

_DEVICE_FIELDS = (
    "compiled", "correct", "correct_trials_passed", "max_abs_error", "ref_runtime_ms",
    "cand_runtime_ms", "ref_runtime_iqr_ms", "cand_runtime_iqr_ms", "speedup_repeats",
    "speedup_low_repeats", "speedup_high_repeats", "speedup_median", "speedup_low",
    "speedup_high", "num_repeats", "launch_bound", "timing_mode", "kb_speedup",
    "compile_log_tail", "error", "error_phase", "wall_correct_s", "wall_timing_s",
    "tolerance_needed", "output_precision", "variants_run", "reference_input_insensitive",
    "timed_outputs_checked", "kb_trial_tolerance",
) + DYNAMIC_FLAGS


@dataclass
class Prepared:
    """A job after static checks, extraction and its builds; ready for a device worker."""

    job: object
    seed: int
    static_flags: dict
    keys: list[str] = field(default_factory=list)
    token: str = ""  # unique within a session (job ids may repeat across calls)
    extract_s: float = 0.0
    final_row: dict | None = None  # set when the job ends before the device (build failed...)


def prepared_failure(item: Prepared, phase: str, error: str, log: str | None = None) -> dict:
    row = empty_row(item.job.job_id, item.job.backend)
    row.update(item.static_flags)
    row.update(error=error, error_phase=phase, compiled=False)
    if log:
        row["compile_log_tail"] = tail(log)
    row["wall_time_s"] = item.extract_s
    return row


def device_row(item: Prepared, reply: dict, sandbox: str) -> dict:
    """The row from a device worker's reply (a result or a failure)."""
    row = empty_row(item.job.job_id, item.job.backend)
    row.update(item.static_flags)
    row["sandbox"] = sandbox
    if reply.get("op") == "failed":
        phase = reply.get("phase", "job")
        row["error"] = f"{reply['kind']}: {reply['error']}\n{reply.get('log', '')}".strip()
        row["error_phase"] = "worker:" + phase
        row["compiled"] = phase.split(":")[0] in ("correct", "timing", "post")
        row["used_keys"] = item.keys
        return row
    data = reply["row"]
    for name in _DEVICE_FIELDS:
        if name in data and data[name] is not None:
            row[name] = data[name]
    row["flag_threads_streams"] = bool(row["flag_threads_streams"] or
                                       data.get("flag_threads_dynamic"))
    row["used_keys"] = data.get("used_keys") or item.keys
    row["wall_device_s"] = data.get("wall_device_s", 0.0)
    return row


_PACKAGE_ROOT = str(Path(__file__).resolve().parents[1])  # the folder holding the package
_TMP_BUILD = re.compile(r"/tmp/[0-9a-f]{64}\.\d+\.\d+")


def scrub_paths(text: str | None, batch_root: Path, cache: Path) -> str | None:
    """Machine- and run-specific paths out of logs, so rows read the same everywhere."""
    if not text:
        return text
    for path, label in ((str(batch_root), "<worker>"), (str(cache), "<cache>"),
                        (_PACKAGE_ROOT, "<src>"), (sys.prefix, "<python>"),
                        (sys.base_prefix, "<python>")):
        text = text.replace(path, label)
    text = re.sub(r"<worker>/[a-z]+-\d+-\d+/(job|extract)-\d+", "<job>", text)
    return _TMP_BUILD.sub("/<build>", text)


def account_builds(row: dict, item: Prepared, built_by: dict, seconds: dict) -> dict:
    """builds_total/cached and wall times, attributing each build to the job that caused it."""
    keys = list(dict.fromkeys(row.pop("used_keys", None) or item.keys))
    owner = item.token or item.job.job_id
    mine = [k for k in keys if built_by.get(k) == owner]
    row["builds_total"] = len(keys)
    row["builds_cached"] = len(keys) - len(mine)
    row["wall_build_s"] = float(sum(seconds.get(k, 0.0) for k in mine))
    device_s = float(row.pop("wall_device_s", 0.0) or 0.0)
    row["wall_time_s"] = float(item.extract_s + row["wall_build_s"] + device_s)
    return finish_row(row)
