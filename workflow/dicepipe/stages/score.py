"""`dicepipe score`: score anyone's kernels with the harness.

Input is either two folders whose files pair up by name (reference programs and candidate
kernel files, KernelBench format), or a Parquet file of pairs. Output is the harness's
result table (RESULT_SCHEMA) and a short summary on stdout. Re-running with the same
`--out` resumes: a job whose row is already there for the same reference, candidate and
measuring settings is not run again (a changed file is measured again); the first line printed
says how many rows were reused.

    dicepipe score --references refs/ --candidates kernels/ --backend cpu --out scores.parquet
    dicepipe score --pairs pairs.parquet --backend cuda --out scores.parquet --repeats 5
"""

from __future__ import annotations

import logging
from pathlib import Path

from kernelharness.cli import add_score_arguments
from kernelharness.programs import FolderJobs, load_folder_jobs, load_pairs_jobs, unpaired_lines
from kernelharness.programs import names_text as _names

from ..errors import StageInputError
from ..judgement import named_protocol

log = logging.getLogger(__name__)
# the loaders are the harness's own (kernelharness.programs), shared with `kernelharness score`
__all__ = ["FolderJobs", "load_folder_jobs", "load_pairs_jobs", "run", "summarize",
           "unpaired_lines"]


def add_arguments(parser) -> None:
    add_score_arguments(parser, cache_default="harness.run.cache_dir of params.yaml")
    parser.add_argument("--wait-s", type=float, default=0.0,
                        help="seconds to wait while another run writes --out (default 0: "
                             "refuse at once, naming it)")


def summarize(table, thresholds: list[float], robust: bool, protocols: dict) -> list[str]:
    """Counts under each protocol, by name: evaluation/metrics.py's score_group over the rows,
    each row its own task (so its Exec, fast_p and geomean are the evaluation's), verdicts
    from dicepipe/judgement.py."""
    from ..evaluation.metrics import p_label, score_group

    rows = table.to_pylist()
    kind = "robust" if robust else "plain"
    # a reference that fails on its own (its get_inputs raising, say) is the task's failure,
    # left out of every count as evaluation leaves it out (evaluation/scoring.reference_status)
    records = [{"task_id": r["job_id"], "level": 0,
                "reference_ok": r.get("error_phase") != "reference", "result": r} for r in rows]
    failed = [r["result"]["job_id"] for r in records if not r["reference_ok"]]
    # a reference that does not fit the device even in the leanest memory plan: the task's
    # too, named apart (kernelharness/worker/memory_plans.py)
    limited = [r["job_id"] for r in rows if r["job_id"] in failed
               and (r.get("error") or "").startswith("harness-limited")]
    n = len(rows) - len(failed)
    lines = [f"{len(rows)} kernels: {sum(bool(r['compiled']) for r in rows)} compiled"]
    if len(failed) > len(limited):
        own = [name for name in failed if name not in limited]
        lines.append(f"{len(own)} references failed on their own (a reference failure, not a "
                     f"wrong candidate; left out of the counts below): {_names(own)}")
    if limited:
        lines.append(f"{len(limited)} tasks are harness-limited: their reference alone does not "
                     "fit this device's memory (not the candidate's failure; left out of the "
                     f"counts below): {_names(limited)}")

    def count(share):  # score_group's shares are means over one-row tasks
        return round((share or 0) * n)

    for name in protocols:
        protocol = named_protocol(name, protocols)
        plain, strict = (score_group(records, protocol, flagged, thresholds, []) if n else {}
                         for flagged in (False, True))

        lines.append(f"[{name}] {count(plain.get('exec'))} correct, "
                     f"{count(strict.get('exec'))} correct without deception flags")
        scores = strict if robust else plain
        for p in thresholds:
            faster = count(scores.get(f"fast_{p_label(p)}_interval"))
            lines.append(f"[{name}] fast_{p:g} ({kind}, interval above {p:g}): {faster}/{n}")
        if scores.get("geomean_speedup"):
            lines.append(f"[{name}] geometric mean speedup over the {count(scores['exec'])} "
                         f"{kind}-correct kernels: {scores['geomean_speedup']:.3f}")
    flagged = {name: sum(bool(r[name]) for r in rows) for name in table.column_names
               if name.startswith("flag_")}
    shown = ", ".join(f"{k[5:]}={v}" for k, v in flagged.items() if v)
    lines.append(f"deception flags: {shown or 'none'}")
    return lines


def run(args, params: dict) -> int:
    from kernelharness import HarnessSession, HarnessSettings, stored_results

    if args.candidates and not args.references:
        raise StageInputError("--candidates needs --references (the folder of reference "
                              "programs with the same file names).")
    if args.candidates:
        found = load_folder_jobs(Path(args.references), Path(args.candidates), args.backend)
    else:
        found = FolderJobs(jobs=load_pairs_jobs(Path(args.pairs), args.backend))
    settings = HarnessSettings.from_params(params["harness"], repeats=args.repeats,
                                           decision_thresholds=args.thresholds,
                                           cache_dir=args.cache_dir)
    log.info("scoring %d kernels on %s", len(found.jobs), args.backend)
    store = stored_results(None, args.out, settings)  # the file the user names
    with HarnessSession(settings) as session:
        table = session.evaluate(found.jobs, results_path=store, progress=True,
                                 wait_s=args.wait_s, unrun=found.unreadable,
                                 remeasure=args.remeasure)
        # how many rows --out already held for the same programs and settings, and any
        # damaged cache entry that was rebuilt
        for line in session.last_summary.lines():
            print(line)
    for line in summarize(table, args.thresholds, params["score"]["robust"], params["protocols"]):
        print(line)
    for line in unpaired_lines(found):
        print(line)
    print(f"results: {args.out}")
    return 0
