"""The attempt loop: ask the author for a candidate per open task, verify the round's
candidates with the harness in one batch (its builds run in parallel), keep the first
candidate of each task that passes the verdict (records.classify), and go on with the
tasks still open, up to `augment.attempts` rounds.

Resume. Drafts are journalled (draft_journal.jsonl in the work folder, keyed by the
author's fingerprint, the task and the attempt) and harness rows go to the harness's own
results file (one per measuring setup: harness.stored_results), whose job ids carry a hash of
the candidate; a re-run after a kill asks the author and the harness only for what is missing.
Transient author failures (timeouts, refused connections, HTTP errors) are not journalled, so a
re-run asks again."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tqdm import tqdm

from ..data import extract
from .authors.draft import Draft
from .records import attempt_row, classify
from .tasks import Task

log = logging.getLogger(__name__)


class DraftJournal:
    """Append-only JSON-lines store of drafts; a line cut short by a kill is ignored."""

    def __init__(self, path: Path, fingerprint: str):
        self.path = path
        self.fingerprint = fingerprint
        self.drafts: dict[str, Draft] = {}
        if path.is_file():
            with open(path, encoding="utf-8") as fh:
                for line in fh:
                    try:
                        entry = json.loads(line)
                    except json.JSONDecodeError:
                        continue
                    self.drafts[entry["key"]] = Draft(entry.get("code"), entry.get("failure"),
                                                      entry.get("detail", ""))
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(path, "a", encoding="utf-8")

    def key(self, task: Task, attempt: int) -> str:
        blob = f"{self.fingerprint}\0{task.task_id}\0{task.reference_code}\0{attempt}"
        return hashlib.sha256(blob.encode()).hexdigest()[:24]

    def add(self, key: str, draft: Draft) -> None:
        self.drafts[key] = draft
        entry = {"key": key, "code": draft.code, "failure": draft.failure, "detail": draft.detail}
        self._fh.write(json.dumps(entry) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()


def job_id(task: Task, attempt: int, code: str) -> str:
    """Names the exact file measured: a changed candidate is a new job, never a stale row."""
    digest = hashlib.sha256(code.encode()).hexdigest()[:12]
    return f"{task.task_id}__a{attempt}__{digest}"


def _draft_round(author, tasks: list[Task], attempt: int, journal: DraftJournal,
                 workers: int) -> dict[str, Draft | None]:
    """Drafts for one attempt of every open task: journalled ones reused, others written."""
    drafts: dict[str, Draft | None] = {}
    missing = []
    for task in tasks:
        cached = journal.drafts.get(journal.key(task, attempt))
        if cached is not None:
            drafts[task.task_id] = cached
        else:
            missing.append(task)

    def write(task: Task):
        return task, author.write(task, attempt)

    bar = tqdm(total=len(missing), desc=f"author {author.name} attempt {attempt}", unit="task",
               disable=not missing or author.name == "templates")
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for task, draft in pool.map(write, missing):
            if draft is not None and draft.code is not None:
                draft = Draft(code=extract.normalise_code(draft.code))
            drafts[task.task_id] = draft
            if draft is not None and not draft.transient:
                journal.add(journal.key(task, attempt), draft)
            bar.update()
    bar.close()
    return drafts


def run_attempts(tasks: list[Task], author, settings: dict, harness_settings, work_dir: Path,
                 robust: bool, protocol) -> tuple[list[dict], dict[str, str]]:
    """Every attempt row (in task order, then attempt order) and the kept candidate file of
    each task that yielded one."""
    from kernelharness import Job, evaluate, stored_results

    work_dir.mkdir(parents=True, exist_ok=True)
    journal = DraftJournal(work_dir / "draft_journal.jsonl", author.fingerprint())
    rows: dict[str, list[dict]] = {task.task_id: [] for task in tasks}
    kept: dict[str, str] = {}
    open_tasks = list(tasks)
    try:
        for attempt in range(settings["attempts"]):
            if not open_tasks:
                break
            drafts = _draft_round(author, open_tasks, attempt, journal,
                                  getattr(author, "concurrency", 1))
            open_tasks = [t for t in open_tasks if drafts[t.task_id] is not None]
            jobs = {t.task_id: Job(job_id(t, attempt, drafts[t.task_id].code),
                                   extract.normalise_code(t.reference_code),
                                   drafts[t.task_id].code, t.backend)
                    for t in open_tasks if drafts[t.task_id].code is not None}
            log.info("attempt %d: %d open tasks, %d candidates to verify", attempt,
                     len(open_tasks), len(jobs))
            results = {}
            if jobs:
                table = evaluate(list(jobs.values()), harness_settings,
                                 results_path=stored_results(work_dir, "harness", harness_settings))
                results = {row["job_id"]: row for row in table.to_pylist()}
            still_open = []
            for task in open_tasks:
                draft = drafts[task.task_id]
                if draft.code is None:
                    row = attempt_row(task, attempt, author.name, reason=draft.failure,
                                      detail=draft.detail or None)
                else:
                    jid = jobs[task.task_id].job_id
                    reason = classify(results[jid], threshold=settings["speedup_threshold"],
                                      statistic=settings["speedup_statistic"], robust=robust,
                                      protocol=protocol)
                    row = attempt_row(task, attempt, author.name, job_id=jid,
                                      result=results[jid], reason=reason)
                rows[task.task_id].append(row)
                if row["kept"]:
                    kept[task.task_id] = draft.code
                else:
                    still_open.append(task)
            open_tasks = still_open
    finally:
        journal.close()
    return [row for task in tasks for row in rows[task.task_id]], kept
