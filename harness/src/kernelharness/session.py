"""`HarnessSession` and `evaluate`: the harness's public entry points.

    with HarnessSession(settings) as h:            # workers stay warm between calls
        table = h.evaluate(jobs, results_path=None, progress=True, measure_speed=True)

Every job has a content key: the hash of its reference and candidate programs, its backend,
the settings that change a measurement (settings.MEASUREMENT_FIELDS), the toolchain, and
whether speed is measured. A key is evaluated once per session: a job whose key was seen
before (earlier in the same call, or in an earlier call) gets a copy of that row under its
own job id (`reused` true, wall times 0). With `results_path`, rows are appended to a
journal beside it as they finish and the file is rewritten as Parquet; a later call reuses a
stored row only when its job id and content key both match (a changed candidate, reference
or setting is measured again). `last_summary` says what each call measured and reused.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from .compilation.buildspec import toolchain_fingerprint
from .errors import HarnessError
from .method import METHOD_VERSION
from .orchestrator import Batch
from .results import RESULT_SCHEMA, ResultStore, finish_row, rows_to_table
from .settings import HarnessSettings, Job

log = logging.getLogger(__name__)
FLUSH_EVERY_S = 60.0
# Set (to anything but "" or "0"), every call measures its jobs again instead of reusing the
# rows of its results file (the same as `--remeasure` of verify and score); new rows still
# replace the stored ones, so a later run without it reuses them.
REMEASURE_ENV = "DICEPIPE_REMEASURE"


def remeasure_asked(flag: bool = False) -> bool:
    """Whether stored rows are to be measured again: the flag, or REMEASURE_ENV set."""
    return flag or os.environ.get(REMEASURE_ENV, "") not in ("", "0")
# Rows remembered for de-duplication (LRU); a row is a few kB, so a few tens of MB at most.
MEMO_ROWS = 20_000
# Not the candidate's doing (the harness or a worker failed to start, or failed around the
# job): never memoized in the session, never reused from a results file.
_TRANSIENT_PHASES = ("harness", "worker:start", "worker:job")


@dataclass
class CallSummary:
    """What one `evaluate` call did with its jobs."""

    jobs: int = 0
    measured: int = 0  # evaluated by a worker in this call
    copied: int = 0  # identical to a job measured earlier in this session (this call or before)
    from_store: int = 0  # taken from results_path (same job id and content)
    stale_in_store: int = 0  # stored under the job id but for other content: measured again
    damaged_in_store: int = 0  # stored rows that did not match their hash: measured again
    ignored_in_store: int = 0  # stored rows passed over because re-measurement was asked for
    unrun: int = 0  # rows decided before any run (an unreadable input file)
    repairs: list[str] = field(default_factory=list)  # damaged cache entries rebuilt

    def line(self) -> str:
        text = (f"{self.jobs} jobs: {self.measured} measured, {self.copied} copied from "
                f"identical jobs, {self.from_store} reused from the results file")
        if self.unrun:
            text += f", {self.unrun} not run (their files could not be read)"
        if self.stale_in_store:
            text += (f" ({self.stale_in_store} stored rows were for another program or "
                     f"settings and were measured again)")
        if self.damaged_in_store:
            text += (f" ({self.damaged_in_store} stored rows were damaged (their content does "
                     "not match their hash) and were measured again)")
        if self.ignored_in_store:
            text += (f" ({self.ignored_in_store} stored rows not reused: re-measurement "
                     f"was asked for, {REMEASURE_ENV} or --remeasure)")
        return text

    def lines(self) -> list[str]:
        """The summary line, then one line per damaged cache entry rebuilt."""
        return [self.line(), *self.repairs]


def stored_results(folder: str | os.PathLike | None, name: str,
                   settings: HarnessSettings) -> Path:
    """The one rule for reusing stored results (verify, augment, evaluate and `dicepipe score`
    call it). Rows are kept per measurement setup, `<folder>/<name>-<key>.parquet`, where the
    key is a digest of `settings.measurement_key()` (harness.measure and the caller's repeats,
    decision thresholds and timing gate; never harness.run, so a run-only setting reuses
    everything); inside, `HarnessSession.evaluate` reuses a row only under the same job id and
    content key (the same programs and backend too), so a changed file or setting is measured
    again, never trusted by name. `folder=None` (`dicepipe score --out`, a file the user
    names): that file."""
    if folder is None:
        return Path(name)
    blob = json.dumps(settings.measurement_key(), sort_keys=True)
    digest = hashlib.sha256(blob.encode()).hexdigest()[:16]
    return Path(folder) / f"{name}-{digest}.parquet"


def _reusable(stored: dict, key: str) -> bool:
    """Same content, and a row of today's schema (a row from before a column was added is
    measured again rather than shown with that column missing), and not a check that ran
    out of memory before the checks had memory plans."""
    return (stored.get("content_key") == key and all(n in stored for n in RESULT_SCHEMA.names)
            and (stored.get("error_phase") or "") not in _TRANSIENT_PHASES
            and not _short_of_memory_unplanned(stored))


def _short_of_memory_unplanned(stored: dict) -> bool:
    """A row whose job ran out of memory with no memory plan named: measured before the
    checks fell back to leaner plans (the harness's own copies running out was recorded
    as the candidate's failure then), or in a phase that has no plans (timing). Today's
    verdicts on memory name the plan ("... in the leanest memory plan ..."). Such rows are
    measured again; every other row means what it meant, so METHOD_VERSION stays."""
    text = stored.get("error") or ""
    return (("out of memory" in text or "OutOfMemoryError" in text)
            and "memory plan" not in text)


def copy_row(row: dict, job_id: str) -> dict:
    """The row of an identical job, under `job_id`: same measurement, nothing spent on it."""
    out = dict(row, job_id=job_id, reused=True, wall_build_s=0.0, wall_correct_s=0.0,
               wall_timing_s=0.0, wall_time_s=0.0)
    out["builds_cached"] = out.get("builds_total", 0)
    return out


class HarnessSession:
    """Warm workers and the rows of every content key seen, for many `evaluate` calls.

    `evaluate` blocks until its rows are in; `submit` returns futures at once, and jobs of
    every call share one stream of builds and device work. Calls come from one thread;
    `close()` (or leaving the `with`) stops the workers and removes their temporary folders.
    """

    def __init__(self, settings: HarnessSettings):
        self.settings = settings
        self._batch: Batch | None = None
        self._toolchains: dict[str, dict] = {}
        self._memo: OrderedDict[str, dict] = OrderedDict()
        self._serial = 0
        self._lock = threading.RLock()  # memo and in-flight keys (rows arrive on harness threads)
        self._inflight: dict[str, list[tuple[str, Future]]] = {}  # key -> twins waiting on it
        self.last_summary: CallSummary | None = None

    def __enter__(self) -> HarnessSession:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop every worker and remove the session's temporary folder."""
        if self._batch is not None:
            self._batch.close()
            self._batch = None

    def toolchain(self, backend: str) -> dict:
        if backend not in self._toolchains:
            self._toolchains[backend] = toolchain_fingerprint(backend)
        return self._toolchains[backend]

    def content_key(self, job: Job, measure_speed: bool = True) -> str:
        blob = json.dumps({"reference": job.reference_code, "candidate": job.candidate_code,
                           "backend": job.backend, "settings": self.settings.measurement_key(),
                           "toolchain": self.toolchain(job.backend),
                           "measure_speed": bool(measure_speed),
                           "method": METHOD_VERSION}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()

    def evaluate(self, jobs: Iterable[Job], results_path: str | os.PathLike | None = None,
                 progress: bool = True, measure_speed: bool = True,
                 wait_s: float = 0.0, unrun: Iterable[dict] = (),
                 remeasure: bool = False) -> pa.Table:
        """One RESULT_SCHEMA row per job, in the order of `jobs`, then the `unrun` rows.

        measure_speed=False: correctness only (never timed: speed columns empty/null).
        wait_s: how long to wait for another writer of `results_path` (results.py's lock)
        before refusing with a HarnessError that names it.
        unrun: rows decided before any run (an input file that could not be read, made with
        results.empty_row): stored beside the others, never reused (no content key).
        remeasure: no row of `results_path` is reused (also when REMEASURE_ENV is set); the
        new rows replace them there.
        """
        jobs = list(jobs)
        unrun = [finish_row(dict(row, content_key=None)) for row in unrun]
        ids = [job.job_id for job in jobs] + [row["job_id"] for row in unrun]
        if len(set(ids)) != len(ids):
            dupes = sorted({i for i in ids if ids.count(i) > 1})[:5]
            raise HarnessError(f"job ids must be unique within a call; repeated: {dupes}")
        keys = {job.job_id: self.content_key(job, measure_speed) for job in jobs}
        summary = CallSummary(jobs=len(ids), unrun=len(unrun))
        store = ResultStore(results_path, wait_s=wait_s)
        repairs_before = len(self._batch.repairs) if self._batch is not None else 0
        try:
            rows, first, copies = self._plan(jobs, keys, store, summary,
                                             remeasure_asked(remeasure))
            for row in unrun:
                rows[row["job_id"]] = row
                store.add(row)
            if first:
                self._measure(list(first.values()), keys, copies, rows, store, progress,
                              measure_speed, summary)
            store.flush()
            if store.path is not None:
                # while still the writer: the next one opens a journal of its own
                store.journal_path.unlink(missing_ok=True)
                store.close()
        finally:
            store.close()
        if self._batch is not None:
            summary.repairs = self._batch.repairs[repairs_before:]
        self.last_summary = summary
        for line in summary.lines():
            log.info("harness: %s", line)
        return rows_to_table(rows[i] for i in ids)

    def _plan(self, jobs: list[Job], keys: dict, store: ResultStore, summary: CallSummary,
              remeasure: bool = False) -> tuple[dict, dict, dict]:
        """Rows known already; the first job of every new key; the jobs that copy it."""
        rows: dict[str, dict] = {}
        first: dict[str, Job] = {}
        copies: dict[str, list[Job]] = {}
        damaged = set(store.damaged)
        for job in jobs:
            key = keys[job.job_id]
            stored = store.rows.get(job.job_id)
            if stored is not None and remeasure:
                summary.ignored_in_store += 1
                stored = None
            summary.damaged_in_store += stored is None and job.job_id in damaged
            if stored is not None and _reusable(stored, key):
                rows[job.job_id] = stored
                self._remember(key, stored)
                summary.from_store += 1
                continue
            summary.stale_in_store += stored is not None
            with self._lock:
                seen = self._memo.get(key)
                if seen is not None:
                    self._memo.move_to_end(key)
            if seen is not None:
                rows[job.job_id] = copy_row(seen, job.job_id)
                store.add(rows[job.job_id])
                summary.copied += 1
            elif key in first:
                copies.setdefault(key, []).append(job)
                summary.copied += 1
            else:
                first[key] = job
        if summary.stale_in_store:
            log.warning("%d stored rows in %s were measured for another program or settings; "
                        "measuring them again", summary.stale_in_store, store.path)
        return rows, first, copies

    def _measure(self, todo: list[Job], keys: dict, copies: dict, rows: dict,
                 store: ResultStore, progress: bool, measure_speed: bool,
                 summary: CallSummary) -> None:
        last_flush = [time.monotonic()]

        def on_row(row: dict) -> None:
            key = keys[row["job_id"]]
            self._record(key, row)
            rows[row["job_id"]] = row
            store.add(row)
            summary.measured += 1
            for twin in copies.get(key, []):
                rows[twin.job_id] = copy_row(row, twin.job_id)
                store.add(rows[twin.job_id])
            if time.monotonic() - last_flush[0] > FLUSH_EVERY_S:
                store.flush()
                last_flush[0] = time.monotonic()

        batch = self._batch_for({job.backend for job in todo})
        tokens = []
        for job in todo:
            self._serial += 1
            tokens.append((f"{self._serial}:{job.job_id}", job))
        try:
            batch.run(tokens, on_row, progress, measure_speed)
        except BaseException:
            self.close()  # threads of the failed call may still hold workers: start afresh
            raise

    def submit(self, jobs: Iterable[Job], measure_speed: bool = True) -> list[Future]:
        """Start `jobs` and return at once: a Future per job, in order, resolved with its row
        (RESULT_SCHEMA's columns) from a harness thread. Every call feeds one stream, so the
        builds of jobs submitted now start while earlier calls' jobs still build or run, and
        no call waits for another's slowest build. A job identical to one measured earlier
        in the session, or still in flight, is never measured twice: its future gets a copy
        of that row under its own job id. Rows are not stored in a results file (that is
        `evaluate`'s). If the batch cannot go on (its device worker fails to start), the
        futures raise that HarnessError and the next call starts fresh workers."""
        jobs = list(jobs)
        futures: list[Future] = []
        for job in jobs:
            key = self.content_key(job, measure_speed)
            future: Future = Future()
            futures.append(future)
            with self._lock:
                seen = self._memo.get(key)
                if seen is not None:
                    self._memo.move_to_end(key)
                    future.set_result(copy_row(seen, job.job_id))
                    continue
                if key in self._inflight:
                    self._inflight[key].append((job.job_id, future))
                    continue
            batch = self._batch_for({job.backend})  # (before this key counts as in flight)
            with self._lock:
                self._inflight[key] = []
                self._serial += 1
                token = f"{self._serial}:{job.job_id}"
            batch.submit(token, job, functools.partial(self._streamed, key, future), measure_speed)
        return futures

    def _streamed(self, key: str, future: Future, kind: str, payload) -> None:
        """A submitted job's row (or the batch's error): its future and its twins'."""
        if kind == "abort":
            with self._lock:
                twins = self._inflight.pop(key, [])
            for f in [future] + [f for _id, f in twins]:
                if not f.done():
                    f.set_exception(payload)
            return
        self._record(key, payload)
        with self._lock:
            twins = self._inflight.pop(key, [])
        future.set_result(payload)
        for job_id, twin in twins:
            twin.set_result(copy_row(payload, job_id))

    def in_flight(self) -> int:
        """Distinct jobs submitted and not finished."""
        with self._lock:
            return len(self._inflight)

    def _record(self, key: str, row: dict) -> None:
        """A measured row's session columns; remembered unless the failure was the harness's."""
        row["content_key"] = key
        row["cudnn_allow_tf32"] = self.settings.cudnn_allow_tf32
        row["matmul_allow_tf32"] = self.settings.matmul_allow_tf32
        if (row.get("error_phase") or "") not in _TRANSIENT_PHASES:
            self._remember(key, row)

    def _remember(self, key: str, row: dict) -> None:
        with self._lock:
            self._memo[key] = row
            self._memo.move_to_end(key)
            while len(self._memo) > MEMO_ROWS:
                self._memo.popitem(last=False)

    def _batch_for(self, backends: set[str]) -> Batch:
        """The warm workers, started on first use; a new backend restarts them with both
        (refused while submitted jobs are in flight: they would lose their workers). A batch
        that cannot go on is replaced."""
        if self._batch is not None and self._batch.broken is not None and not self.in_flight():
            self.close()
        if self._batch is not None and backends <= self._batch.backends:
            return self._batch
        if self._batch is not None and self.in_flight():
            raise HarnessError(f"backend {sorted(backends)} asked for while {self.in_flight()} "
                               f"submitted jobs of {sorted(self._batch.backends)} are in flight; "
                               "wait for their futures first.")
        wanted = sorted(backends | (self._batch.backends if self._batch else set()))
        self.close()
        self._batch = Batch(self.settings, wanted, {b: self.toolchain(b) for b in wanted})
        return self._batch


def evaluate(jobs: Iterable[Job], settings: HarnessSettings,
             results_path: str | os.PathLike | None = None, progress: bool = True,
             measure_speed: bool = True, remeasure: bool = False) -> pa.Table:
    """One-shot: a session for one call (workers started and stopped here)."""
    with HarnessSession(settings) as session:
        return session.evaluate(jobs, results_path, progress, measure_speed,
                                remeasure=remeasure)
