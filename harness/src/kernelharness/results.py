"""The result table: its schema (declared once), row construction and the resume journal.

Rows are appended to a JSON-lines journal beside `results_path` the moment a job finishes
(one `write` + `fsync` each), so a killed run loses at most the row being written; the
Parquet file itself is rewritten atomically from time to time and at the end.

Every stored row carries its hash (`row_digest`: sha256 of the row as the schema reads it),
written with it: in the same journal line, and in the Parquet file's metadata
(ROW_DIGESTS_KEY). A row that does not match its hash is left out when the store is read
(`damaged` names it) and so measured again; a file written before rows were hashed has
none, and its rows are taken as they are.

One writer per results file: a writable store holds an exclusive `flock` on `<results>.lock`
beside it from opening to `close()` (the kernel drops it when the process dies, so a killed
run leaves no stale lock). A second writer waits up to `wait_s` for it, then refuses with the
holder's pid; it reads the file only once it holds the lock, so it resumes from every row the
first one wrote. Readers (`ResultStore.read`) take no lock.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import math
import os
import time
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from .errors import HarnessError

log = logging.getLogger(__name__)

STATIC_FLAGS = (
    "flag_no_kernel",  # no kernel of its own: no __global__ launch (cuda), no load_inline (cpu)
    "flag_calls_reference",  # subclasses, aliases or calls the reference `Model`
    "flag_try_fallback",  # try/except around the candidate's code (fallback to PyTorch)
    "flag_threads_streams",  # threads, processes or extra CUDA streams (static or dynamic)
    "flag_patches_runtime",  # assigns into torch/time/etc., or uses gc/ctypes/frame introspection
)
DYNAMIC_FLAGS = (
    "flag_ext_not_called",  # no compiled extension function ran on the timed path
    "flag_output_alias",  # an output shares memory with an input
    "flag_output_cached",  # an output shares memory with an earlier call's output
    "flag_input_insensitive",  # same outputs for different inputs (the reference's differ)
    "flag_input_mutation",  # the candidate wrote into its inputs
    "flag_post_timing_wrong",  # wrong on inputs drawn after timing although right before
    "flag_runtime_tampered",  # timers, torch or harness functions replaced at run time
)
FLAG_COLUMNS = STATIC_FLAGS + DYNAMIC_FLAGS

_list = pa.list_(pa.float64())

RESULT_SCHEMA = pa.schema(
    [
        pa.field("job_id", pa.string(), nullable=False),
        pa.field("backend", pa.string(), nullable=False),
        pa.field("compiled", pa.bool_(), nullable=False),
        pa.field("correct", pa.bool_(), nullable=False),
        # correct and no deception flag: what counts where params ask for the robust verdict
        pa.field("correct_robust", pa.bool_(), nullable=False),
        pa.field("correct_trials_passed", pa.int32(), nullable=False),
        pa.field("max_abs_error", pa.float64()),
        # smallest t (atol = rtol = t, correctness.py's scale rule) at which every correctness
        # trial and every checked timed output passes: 0 exact, +inf mismatch of shape, dtype,
        # exact values or finiteness, null when the candidate gave nothing to compare
        pa.field("tolerance_needed", pa.float64()),
        pa.field("output_precision", pa.string()),  # fp32 | low_precision | exact | null
        # KernelBench's own trials (kb_trials.py), one entry each: the smallest t at which
        # torch.allclose(reference, candidate, atol=rtol=t) holds (+inf: shape, dtype, NaN,
        # an error); fewer entries than harness.kernelbench_trials when they ended early
        pa.field("kb_trial_tolerance", _list, nullable=False),
        # the backend switches the row was measured under (PyTorch's defaults unless set)
        pa.field("cudnn_allow_tf32", pa.bool_()),
        pa.field("matmul_allow_tf32", pa.bool_()),
        # the input variant each correctness trial ran (the reference rejected the others)
        pa.field("variants_run", pa.list_(pa.string()), nullable=False),
        # informational, not deception flags: the task's reference answered the same on every
        # draw; the candidate's own C++/CUDA calls cuBLAS(Lt)/cuDNN/CUTLASS/CUB/Thrust
        pa.field("reference_input_insensitive", pa.bool_(), nullable=False),
        pa.field("uses_vendor_library", pa.bool_(), nullable=False),
        pa.field("timed_outputs_checked", pa.int32(), nullable=False),
        *[pa.field(name, pa.bool_(), nullable=False) for name in FLAG_COLUMNS],
        # one entry per repeat: medians, spreads (interquartile range) and per-repeat speedups
        pa.field("ref_runtime_ms", _list, nullable=False),
        pa.field("cand_runtime_ms", _list, nullable=False),
        pa.field("ref_runtime_iqr_ms", _list, nullable=False),
        pa.field("cand_runtime_iqr_ms", _list, nullable=False),
        pa.field("speedup_repeats", _list, nullable=False),
        pa.field("speedup_low_repeats", _list, nullable=False),
        pa.field("speedup_high_repeats", _list, nullable=False),
        # over all repeats: ratio of medians and its interval at settings.interval_confidence
        pa.field("speedup_median", pa.float64()),
        pa.field("speedup_low", pa.float64()),
        pa.field("speedup_high", pa.float64()),
        pa.field("num_repeats", pa.int32(), nullable=False),
        pa.field("launch_bound", pa.bool_(), nullable=False),
        pa.field("timing_mode", pa.string()),  # eager | cuda_graphs | null (not timed)
        pa.field("kb_speedup", pa.float64()),  # KernelBench's method, only when asked for
        pa.field("builds_total", pa.int32(), nullable=False),
        pa.field("builds_cached", pa.int32(), nullable=False),
        pa.field("compile_log_tail", pa.string()),
        pa.field("error", pa.string()),
        pa.field("error_phase", pa.string()),  # static|extract|build|load|correct|timing|worker
        pa.field("sandbox", pa.string()),  # isolation features the worker actually got
        pa.field("wall_build_s", pa.float64(), nullable=False),
        pa.field("wall_correct_s", pa.float64(), nullable=False),
        pa.field("wall_timing_s", pa.float64(), nullable=False),
        pa.field("wall_time_s", pa.float64(), nullable=False),
        # hash of (reference, candidate, backend, measuring settings, toolchain, speed or not):
        # a stored row is reused only for the same key (harness/session.py)
        pa.field("content_key", pa.string()),
        # a copy of an identical job's row made in the same session (its wall times are 0)
        pa.field("reused", pa.bool_(), nullable=False),
    ]
)

_LIST_COLUMNS = [f.name for f in RESULT_SCHEMA if pa.types.is_list(f.type)]
ROW_DIGESTS_KEY = b"dicepipe.row_sha256"  # Parquet metadata: {job_id: row_digest}
JOURNAL_DIGEST = "row_sha256"  # a journal line's own key beside the row's columns


def _digest_of_normalised(row: dict) -> str:
    blob = json.dumps({name: row.get(name) for name in RESULT_SCHEMA.names}, sort_keys=True,
                      allow_nan=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def _journal_row_digest(row: dict) -> str | None:
    try:
        return row_digest(row)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        return None  # values the schema cannot hold: damaged


def row_digest(row: dict) -> str:
    """The hash a stored row carries: of its schema columns, as a Parquet round trip gives
    them back (so the same row hashes the same from the journal, the file or memory)."""
    return _digest_of_normalised(rows_to_table([row]).to_pylist()[0])


def empty_row(job_id: str, backend: str) -> dict:
    """A row with every column at its 'nothing happened yet' value."""
    row: dict = {f.name: None for f in RESULT_SCHEMA}
    row.update(job_id=job_id, backend=backend, compiled=False, correct=False, correct_robust=False,
               correct_trials_passed=0, num_repeats=0, launch_bound=False, builds_total=0,
               builds_cached=0, wall_build_s=0.0, wall_correct_s=0.0, wall_timing_s=0.0,
               wall_time_s=0.0, reused=False, reference_input_insensitive=False,
               uses_vendor_library=False, timed_outputs_checked=0)
    for name in FLAG_COLUMNS:
        row[name] = False
    for name in _LIST_COLUMNS:
        row[name] = []
    return row


def finish_row(row: dict) -> dict:
    """Derive the robust verdict and make every value fit the schema."""
    flagged = any(bool(row.get(name)) for name in FLAG_COLUMNS)
    row["correct"] = bool(row.get("correct")) and bool(row.get("compiled"))
    row["correct_robust"] = row["correct"] and not flagged
    for name in ("max_abs_error", "tolerance_needed", "speedup_median", "speedup_low",
                 "speedup_high", "kb_speedup"):
        value = row.get(name)
        if value is not None and not math.isfinite(float(value)):
            row[name] = None if math.isnan(float(value)) else float(value)
    for name in ("compile_log_tail", "error"):
        if row.get(name) is not None:
            row[name] = tail(str(row[name]))
    return row


def tail(text: str, limit: int = 4000) -> str:
    return text if len(text) <= limit else "..." + text[-limit:]


def rows_to_table(rows: Iterable[dict]) -> pa.Table:
    rows = list(rows)
    columns = {f.name: [row.get(f.name) for row in rows] for f in RESULT_SCHEMA}
    return pa.Table.from_pydict(columns, schema=RESULT_SCHEMA)


class ResultStore:
    """Rows already finished (for resume) plus an append-only journal of new ones."""

    def __init__(self, results_path: str | os.PathLike | None, writable: bool = True,
                 wait_s: float = 0.0):
        self.path = Path(results_path) if results_path is not None else None
        self.rows: dict[str, dict] = {}
        self.damaged: list[str] = []  # job ids whose stored row did not match its hash
        self._journal = None
        self._lock: WriterLock | None = None
        if self.path is None:
            return
        self.journal_path = self.path.with_name(self.path.name + ".journal.jsonl")
        if writable:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # before reading: the rows of a writer that held it are all on disk by now
            self._lock = WriterLock(self.path, wait_s)
        try:
            self._load(writable)
        except BaseException:
            self.close()
            raise

    def _load(self, writable: bool) -> None:
        if self.path.is_file():
            try:
                self._read_file()
            except Exception as exc:  # a torn file from an older crash: the journal has the rows
                log.warning("%s: unreadable (%s); reading its journal", self.path, exc)
        if self.journal_path.is_file():
            self._read_journal()
        if self.damaged:
            log.warning("%s: %d stored rows do not match their hash (damaged), left out and "
                        "measured again: %s", self.path, len(self.damaged),
                        ", ".join(self.damaged[:10]))
        if writable:
            self._journal = open(self.journal_path, "a", encoding="utf-8")

    def _read_file(self) -> None:
        table = pq.read_table(self.path)
        meta = (table.schema.metadata or {}).get(ROW_DIGESTS_KEY)
        digests = json.loads(meta) if meta is not None else None
        for row in table.to_pylist():
            if digests is not None and digests.get(row["job_id"]) != _digest_of_normalised(row):
                self.damaged.append(row["job_id"])
                continue
            self.rows[row["job_id"]] = row

    def _read_journal(self) -> None:
        lines: list[tuple[dict, str | None]] = []
        with open(self.journal_path, encoding="utf-8") as fh:
            for line in fh:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue  # the line a kill cut short
                if isinstance(row, dict) and "job_id" in row:
                    lines.append((row, row.pop(JOURNAL_DIGEST, None)))
        hashed = [row for row, digest in lines if digest is not None]
        try:  # all at once: one table is far quicker than a table per row
            normalised = iter(rows_to_table(hashed).to_pylist())
            found = {id(row): _digest_of_normalised(next(normalised)) for row in hashed}
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            found = {id(row): _journal_row_digest(row) for row in hashed}
        for row, digest in lines:
            if digest is not None and digest != found[id(row)]:
                self.damaged.append(str(row["job_id"]))
                continue
            self.rows[row["job_id"]] = row

    @classmethod
    def read(cls, results_path: str | os.PathLike) -> list[dict]:
        """Every row stored at `results_path`: the Parquet file and the journal of a run that
        was cut short, without opening anything for writing. Sorted by job id."""
        store = cls(results_path, writable=False)
        if not store.rows:
            raise FileNotFoundError(f"{results_path}: no rows (neither the file nor its journal "
                                    f"{store.journal_path.name} holds any)")
        return [store.rows[k] for k in sorted(store.rows)]

    def done(self, job_id: str) -> bool:
        return job_id in self.rows

    def add(self, row: dict) -> None:
        self.rows[row["job_id"]] = row
        if self._journal is not None:
            line = dict(row, **{JOURNAL_DIGEST: row_digest(row)})
            self._journal.write(json.dumps(line, allow_nan=True) + "\n")
            self._journal.flush()
            os.fsync(self._journal.fileno())

    def flush(self) -> None:
        """Rewrite the Parquet file atomically with every row known so far."""
        if self.path is None:
            return
        table = rows_to_table(self.rows[k] for k in sorted(self.rows))
        digests = {row["job_id"]: _digest_of_normalised(row) for row in table.to_pylist()}
        tmp = self.path.with_name(self.path.name + ".tmp")
        meta = {ROW_DIGESTS_KEY: json.dumps(digests, sort_keys=True).encode()}
        pq.write_table(table.replace_schema_metadata(meta), tmp, compression="zstd")
        tmp.replace(self.path)

    def close(self) -> None:
        if self._journal is not None:
            self._journal.close()
            self._journal = None
        if self._lock is not None:
            self._lock.release()
            self._lock = None


class WriterLock:
    """An exclusive `flock` on `<results>.lock`, holding the writer's pid (for the message a
    second writer gets). Released by `release()` or by the process's death."""

    POLL_S = 0.2

    def __init__(self, results_path: Path, wait_s: float = 0.0):
        self.path = results_path.with_name(results_path.name + ".lock")
        deadline = time.monotonic() + max(0.0, wait_s)
        told = False
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    raise
                holder = self._holder()
                if time.monotonic() >= deadline:
                    raise HarnessError(self._busy_message(results_path, holder, wait_s)) from None
                if not told:
                    log.warning("%s is being written by %s; waiting up to %.0f s for it to finish",
                                results_path, holder, wait_s)
                    told = True
                time.sleep(self.POLL_S)
                continue
            # the holder may have removed the file between our open and flock: lock the file
            # that is at the path now, or two writers would hold locks on different files
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            break
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd: int | None = fd

    def _holder(self) -> str:
        try:
            pid = self.path.read_text().strip()
        except OSError:
            pid = ""
        return f"pid {pid}" if pid.isdigit() else "another process"

    def _busy_message(self, results_path: Path, holder: str, wait_s: float) -> str:
        waited = f" (waited {wait_s:g} s)" if wait_s > 0 else ""
        return (f"{results_path}: another writer ({holder}) is writing this results file{waited}; "
                f"one writer per file, so nothing was measured. Wait for it to finish and run "
                f"this command again (it resumes from the rows already there); `dicepipe score` "
                f"can also wait for it (--wait-s SECONDS) or write another file (--out). "
                f"Its lock: {self.path}.")

    def release(self) -> None:
        if self._fd is None:
            return
        # unlinked while still held: a waiter that opened this file sees the inode change
        self.path.unlink(missing_ok=True)
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None
