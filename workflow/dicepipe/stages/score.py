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
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import StageInputError
from ..harness.verdict import named_protocol

log = logging.getLogger(__name__)
REFERENCE_COLUMNS = ("reference_code", "reference", "ref_code")
CANDIDATE_COLUMNS = ("candidate_code", "candidate", "kernel_code", "kernel")
ID_COLUMNS = ("job_id", "sample_id", "task_id", "name")


def add_arguments(parser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--candidates", help="folder of candidate files (<name>.py)")
    source.add_argument("--pairs", help="Parquet with reference and candidate code columns")
    parser.add_argument("--references", help="folder of reference programs, same file names")
    parser.add_argument("--backend", required=True, choices=["cpu", "cuda"])
    parser.add_argument("--out", required=True, help="results Parquet (resumed if present)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="measure each kernel up to this many times (default 1)")
    parser.add_argument("--thresholds", type=float, nargs="+", default=[1.0],
                        help="speedups the repeat rule must settle (default 1.0)")
    parser.add_argument("--cache-dir", default=None,
                        help="build cache (default: harness.run.cache_dir of params.yaml)")
    parser.add_argument("--wait-s", type=float, default=0.0,
                        help="seconds to wait while another run writes --out (default 0: "
                             "refuse at once, naming it)")
    parser.add_argument("--remeasure", action="store_true",
                        help="measure every kernel again instead of reusing the rows --out "
                             "holds (also: DICEPIPE_REMEASURE=1)")


@dataclass
class FolderJobs:
    """What a folder pair gives: jobs to run, rows for files that could not be read, and the
    files of one folder with no partner in the other (named in the summary)."""

    jobs: list
    unreadable: list[dict] = field(default_factory=list)
    no_reference: list[str] = field(default_factory=list)  # candidate files
    no_candidate: list[str] = field(default_factory=list)  # reference files


def load_folder_jobs(references: Path, candidates: Path, backend: str) -> FolderJobs:
    from ..evaluation.kernel_files import read_program
    from ..harness import Job
    from ..harness.results import empty_row

    if not references.is_dir():
        raise StageInputError(f"--references {references}: no such folder.")
    if not candidates.is_dir():
        raise StageInputError(f"--candidates {candidates}: no such folder.")
    found = FolderJobs(jobs=[])
    names = {cand.name for cand in candidates.glob("*.py")}
    found.no_candidate = sorted(ref.name for ref in references.glob("*.py")
                                if ref.name not in names)
    for cand in sorted(candidates.glob("*.py")):
        ref = references / cand.name
        if not ref.is_file():
            found.no_reference.append(cand.name)
            continue
        reference_code, ref_error = read_program(ref)
        candidate_code, cand_error = read_program(cand)
        if ref_error or cand_error:
            # a row with its reason, as the harness writes a failure of that phase
            row = empty_row(cand.stem, backend)
            row.update(error=ref_error or cand_error,
                       error_phase="reference" if ref_error else "load")
            found.unreadable.append(row)
            log.warning("%s", row["error"])
            continue
        found.jobs.append(Job(job_id=cand.stem, reference_code=reference_code,
                              candidate_code=candidate_code, backend=backend))
    if found.no_reference:
        log.warning("%d candidates have no reference of the same name in %s (skipped): %s",
                    len(found.no_reference), references, _names(found.no_reference))
    if found.no_candidate:
        log.warning("%d references have no candidate of the same name in %s (skipped): %s",
                    len(found.no_candidate), candidates, _names(found.no_candidate))
    if not found.jobs and not found.unreadable:
        raise StageInputError(f"no candidate in {candidates} has a reference of the same file "
                              f"name in {references}.")
    return found


def _names(files: list[str], shown: int = 10) -> str:
    more = f" and {len(files) - shown} more" if len(files) > shown else ""
    return ", ".join(files[:shown]) + more


def _pick(columns: list[str], wanted: tuple[str, ...], path: Path, what: str) -> str | None:
    for name in wanted:
        if name in columns:
            return name
    if what:
        raise StageInputError(f"{path}: no {what} column. Expected one of {list(wanted)}; "
                              f"found {columns}.")
    return None


def load_pairs_jobs(path: Path, backend: str) -> list:
    from ..data.schema import read_parquet
    from ..harness import Job

    if not path.is_file():
        raise StageInputError(f"--pairs {path}: no such file.")
    table = read_parquet(path)
    ref_col = _pick(table.column_names, REFERENCE_COLUMNS, path, "reference code")
    cand_col = _pick(table.column_names, CANDIDATE_COLUMNS, path, "candidate code")
    id_col = _pick(table.column_names, ID_COLUMNS, path, "")
    rows = table.to_pylist()
    ids = [str(row[id_col]) for row in rows] if id_col else [f"{i:06d}" for i in range(len(rows))]
    if len(set(ids)) != len(ids):
        raise StageInputError(f"{path}: column {id_col!r} has repeated values; ids must be unique.")
    return [Job(job_id=i, reference_code=row[ref_col], candidate_code=row[cand_col],
                backend=backend) for i, row in zip(ids, rows)]


def summarize(table, thresholds: list[float], robust: bool, protocols: dict) -> list[str]:
    """Counts under each protocol, by name: evaluation/metrics.py's score_group over the rows,
    each row its own task (so its Exec, fast_p and geomean are the evaluation's), verdicts
    from harness/verdict.py."""
    from ..evaluation.metrics import p_label, score_group

    rows = table.to_pylist()
    kind = "robust" if robust else "plain"
    # a reference that fails on its own (its get_inputs raising, say) is the task's failure,
    # left out of every count as evaluation leaves it out (evaluation/scoring.reference_status)
    records = [{"task_id": r["job_id"], "level": 0,
                "reference_ok": r.get("error_phase") != "reference", "result": r} for r in rows]
    failed = [r["result"]["job_id"] for r in records if not r["reference_ok"]]
    # a reference that does not fit the device even in the leanest memory plan: the task's
    # too, named apart (harness/worker/memory_plans.py)
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
    from ..harness import HarnessSession, HarnessSettings, stored_results

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


def unpaired_lines(found: FolderJobs) -> list[str]:
    """The summary's account of what was not scored, by file name."""
    lines = []
    if found.unreadable:
        lines.append(f"{len(found.unreadable)} files could not be read (rows with their "
                     f"reason): {_names([row['job_id'] + '.py' for row in found.unreadable])}")
    if found.no_reference:
        lines.append(f"{len(found.no_reference)} candidates have no reference (not scored): "
                     f"{_names(found.no_reference)}")
    if found.no_candidate:
        lines.append(f"{len(found.no_candidate)} references have no candidate (not scored): "
                     f"{_names(found.no_candidate)}")
    return lines
