"""`dicepipe verify`: measure one shard of the ingested samples with the harness
(`dicepipe verify-gather`, stages/verify_gather.py, joins the shards).

verify measures and records; it never filters (the threshold lives in assemble, so changing
it never re-runs measurement). Work is split into shards by a stable hash of the sample id;
each shard writes its rows as they finish into a resume file outside the declared output
(Snakemake and DVC both delete declared outputs of a failed job), so a killed shard resumes.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from ..data.schema import SAMPLE_SCHEMA, read_table, write_table
from ..errors import StageInputError

log = logging.getLogger(__name__)
RESUME_DIR = Path(".cache/dicepipe/resume/verify")


def add_arguments(parser) -> None:
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--samples", required=True, help="ingested samples parquet")
    parser.add_argument("--shard", required=True, help="which shard, as 'I-of-N' (1-based)")
    parser.add_argument("--out", required=True, help="this shard's measurements parquet")
    parser.add_argument("--remeasure", action="store_true",
                        help="measure every sample again instead of reusing the resume "
                             "store's rows (also: DICEPIPE_REMEASURE=1, which reaches the "
                             "command under Snakemake and DVC)")


def parse_shard(text: str) -> tuple[int, int]:
    try:
        index, total = (int(x) for x in text.split("-of-"))
    except ValueError:
        raise StageInputError(f"--shard {text!r}: expected 'I-of-N', e.g. 1-of-4.") from None
    if not 1 <= index <= total:
        raise StageInputError(f"--shard {text!r}: I must lie in 1..N.")
    return index, total


def shard_of(sample_id: str, total: int) -> int:
    """1-based shard of a sample: stable whatever else is in the corpus."""
    return int(hashlib.sha256(sample_id.encode()).hexdigest()[:8], 16) % total + 1


def run(args, params: dict) -> int:
    from kernelharness import HarnessSettings, Job, evaluate, stored_results
    from ..judgement import named_protocol

    index, total = parse_shard(args.shard)
    samples = read_table(args.samples, SAMPLE_SCHEMA).to_pylist()
    mine = [s for s in samples if shard_of(s["sample_id"], total) == index]
    log.info("corpus %s shard %s: %d of %d samples", args.corpus, args.shard, len(mine), len(samples))
    protocol = named_protocol(params["verify"]["protocol"], params["protocols"])
    settings = HarnessSettings.from_params(
        params["harness"],
        repeats=params["verify"]["repeats"],
        decision_thresholds=params["verify"]["decision_thresholds"],
        timing_gate=protocol.check,  # the repeat rule runs for samples its check accepts
    )
    jobs = [Job(job_id=s["sample_id"], reference_code=s["reference_code"],
                candidate_code=s["candidate_code"], backend=s["backend"]) for s in mine]
    resume_path = stored_results(RESUME_DIR / args.corpus, args.shard, settings)
    resume_path.parent.mkdir(parents=True, exist_ok=True)
    table = evaluate(jobs, settings, results_path=resume_path, progress=True,
                     remeasure=args.remeasure)
    order = {job.job_id: i for i, job in enumerate(jobs)}
    table = _sorted_by(table, "job_id", order)
    write_table(table, args.out)
    log.info("shard %s: %d rows, %d correct", args.shard, table.num_rows,
             pc.sum(table.column("correct")).as_py() or 0)
    return 0


def _sorted_by(table: pa.Table, column: str, order: dict) -> pa.Table:
    ranks = pa.array([order[v] for v in table.column(column).to_pylist()], pa.int64())
    return table.take(pc.sort_indices(ranks))
