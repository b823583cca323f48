"""`dicepipe augment`: structural samples for a corpus (the recipe's attention and MLP
blocks at real model shapes), written to data/augment/{corpus}/:

- structural.parquet  kept samples (SAMPLE_SCHEMA, source "structural", reported_speedup =
                      the measured median speedup);
- attempts.parquet    every attempt of every task (augment.records.ATTEMPT_SCHEMA);
- report.json         tasks, tasks with a sample, attempts and tasks counted by reason.

Resume state (drafts journal, harness results) lives in --work-dir, by default
.cache/dicepipe/augment/{corpus}; deleting it starts over."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pyarrow as pa

from ..config import corpus_settings, corpus_spec
from ..judgement import named_protocol
from ..data import extract
from ..data.schema import SAMPLE_SCHEMA, write_table

log = logging.getLogger(__name__)


def add_arguments(parser) -> None:
    parser.add_argument("--corpus", required=True, help="corpus name under `corpora` in params.yaml")
    parser.add_argument("--out", required=True, help="output folder (data/augment/{corpus})")
    parser.add_argument("--work-dir", default=None,
                        help="resume state (default: .cache/dicepipe/augment/{corpus})")


def structural_rows(tasks, kept: dict[str, str], attempt_rows: list[dict]) -> list[dict]:
    """SAMPLE_SCHEMA rows of the kept candidates, in task order."""
    speedups = {row["task_id"]: row["speedup"] for row in attempt_rows if row["kept"]}
    rows = []
    for task in tasks:
        if task.task_id not in kept:
            continue
        reference = extract.normalise_code(task.reference_code)
        candidate = kept[task.task_id]
        rows.append({
            "sample_id": extract.sample_id(reference, candidate),
            "source": "structural",
            "task_name": task.task_id,
            "level": task.level,
            "backend": task.backend,
            "reference_code": reference,
            "candidate_code": candidate,
            "reasoning": None,
            "reported_speedup": speedups[task.task_id],
        })
    return rows


def _harness_settings(params: dict, settings: dict):
    from kernelharness import HarnessSettings

    return HarnessSettings.from_params(params["harness"], repeats=settings["repeats"],
                                       decision_thresholds=(settings["speedup_threshold"],))


def run(args, params: dict) -> int:
    from ..augment import generate_tasks
    from ..augment.authors import make_author
    from ..augment.loop import run_attempts
    from ..augment.records import ATTEMPT_SCHEMA, build_report

    settings = corpus_settings(params["augment"], args.corpus)
    backend = corpus_spec(params, args.corpus)["backend"]
    out = Path(args.out)
    work_dir = Path(args.work_dir or f".cache/dicepipe/augment/{args.corpus}")
    tasks = generate_tasks(settings, backend)
    author = make_author(settings, backend)
    robust = bool(settings["robust"])
    log.info("augment %s (%s): %d tasks, author %s, up to %d attempts each", args.corpus,
             backend, len(tasks), author.name, settings["attempts"])
    protocol = named_protocol(settings["protocol"], params["protocols"])
    attempt_rows, kept = run_attempts(tasks, author, settings, _harness_settings(params, settings),
                                      work_dir, robust, protocol)
    samples = structural_rows(tasks, kept, attempt_rows)
    write_table(pa.Table.from_pylist(samples, schema=SAMPLE_SCHEMA), out / "structural.parquet",
                SAMPLE_SCHEMA)
    write_table(pa.Table.from_pylist(attempt_rows, schema=ATTEMPT_SCHEMA), out / "attempts.parquet",
                ATTEMPT_SCHEMA)
    report = build_report(tasks, attempt_rows, {
        "corpus": args.corpus, "backend": backend, "author": author.name,
        "attempts_per_task": settings["attempts"], "speedup_threshold": settings["speedup_threshold"],
        "speedup_statistic": settings["speedup_statistic"], "robust": robust,
        "protocol": protocol.name,
    })
    tmp = out / "report.json.tmp"
    tmp.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    tmp.replace(out / "report.json")
    log.info("%d of %d tasks yielded a sample; tasks without one: %s", report["tasks_with_sample"],
             report["tasks"], report["tasks_without_sample_by_reason"])
    return 0
