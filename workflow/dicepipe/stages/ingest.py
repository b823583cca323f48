"""`dicepipe ingest`: read a corpus source into data/ingest/{corpus}/samples.parquet.

Rows that cannot be used are counted by reason in report.json and left out, never silently:
malformed, missing_field, too_short, no_model, no_modelnew, syntax_error, duplicate.
"""

from __future__ import annotations

import json
import logging
from collections import Counter, defaultdict
from pathlib import Path

import pyarrow as pa

from ..acquisition import verify_placed
from ..config import corpus_spec
from ..data import extract
from ..data.schema import SAMPLE_SCHEMA, write_table
from ..data.sources import iter_records

log = logging.getLogger(__name__)
EXAMPLES_PER_REASON = 5


def add_arguments(parser) -> None:
    parser.add_argument("--corpus", required=True, help="corpus name under `corpora` in params.yaml")
    parser.add_argument("--out", required=True, help="output samples parquet")
    parser.add_argument("--report", required=True, help="output report json (counts by reason)")


def normalise_record(record: dict, *, source: str, backend: str, settings: dict) -> tuple[dict | None, str | None]:
    """One raw record -> (sample row, None) or (None, drop reason). Pure."""
    if "__malformed__" in record:
        return None, "malformed"
    reference, candidate = record.get("reference"), record.get("candidate")
    if record.get("response") and not candidate:
        candidate = extract.pick_block(record["response"], settings["code_block"])
    if record.get("prompt") and not reference:
        reference = extract.reference_from_prompt(record["prompt"])
    if not reference or not candidate or not isinstance(reference, str) or not isinstance(candidate, str):
        return None, "missing_field"
    reference, candidate = extract.normalise_code(reference), extract.normalise_code(candidate)
    if min(len(reference), len(candidate)) < settings["min_code_chars"]:
        return None, "too_short"
    if not extract.defines_class(reference, "Model") or "def get_inputs" not in reference:
        return None, "no_model"
    if not extract.defines_class(candidate, "ModelNew"):
        return None, "no_modelnew"
    if not (extract.is_valid_python(reference) and extract.is_valid_python(candidate)):
        return None, "syntax_error"
    reasoning = record.get("reasoning")
    if reasoning is None and record.get("response"):
        reasoning = extract.reasoning_from_response(record["response"])
    sid = extract.sample_id(reference, candidate)
    return {
        "sample_id": sid,
        "source": source,
        "task_name": str(record.get("task_name") or sid),
        "level": _as_int(record.get("level")),
        "backend": backend,
        "reference_code": reference,
        "candidate_code": candidate,
        "reasoning": reasoning,
        "reported_speedup": _as_float(record.get("reported_speedup")),
        "prompt": record["prompt"] if isinstance(record.get("prompt"), str) and record["prompt"] else None,
    }, None


def _as_int(value):
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def _as_float(value):
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def ingest_records(records, *, source: str, backend: str, settings: dict):
    """Normalise and deduplicate; return (rows, report). Pure apart from iterating."""
    rows, seen = [], set()
    dropped: Counter = Counter()
    examples: dict[str, list] = defaultdict(list)
    read = 0
    for index, record in enumerate(records):
        read += 1
        row, reason = normalise_record(record, source=source, backend=backend, settings=settings)
        if row is not None and row["sample_id"] in seen:
            row, reason = None, "duplicate"
        if row is None:
            dropped[reason] += 1
            if len(examples[reason]) < EXAMPLES_PER_REASON:
                examples[reason].append(str(record.get("task_name") or f"row {index}"))
            continue
        seen.add(row["sample_id"])
        rows.append(row)
    report = {
        "source": source,
        "rows_read": read,
        "rows_kept": len(rows),
        "dropped": dict(sorted(dropped.items())),
        "dropped_examples": {k: examples[k] for k in sorted(examples)},
    }
    return rows, report


def run(args, params: dict) -> int:
    spec = corpus_spec(params, args.corpus)
    source = spec["source"]
    if source["kind"] != "hub":  # a file put in an acquired folder by hand: its pin first
        verify_placed(source["path"], params.get("acquire", {}))
    name = source.get("name", args.corpus)
    log.info("ingesting corpus %s from %s source %s", args.corpus, source["kind"], source.get("path"))
    rows, report = ingest_records(
        iter_records(source), source=name, backend=spec["backend"], settings=params["ingest"]
    )
    table = pa.Table.from_pylist(rows, schema=SAMPLE_SCHEMA)
    write_table(table, args.out, SAMPLE_SCHEMA)
    Path(args.report).parent.mkdir(parents=True, exist_ok=True)
    Path(args.report).write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    log.info("kept %d of %d rows; dropped %s", report["rows_kept"], report["rows_read"], report["dropped"])
    if not rows:
        log.warning("no usable rows in corpus %s: see %s", args.corpus, args.report)
    return 0
