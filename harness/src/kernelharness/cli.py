"""`kernelharness score`: measure candidate kernels against their references, with the
harness alone (no pipeline).

    kernelharness score --references refs/ --candidates kernels/ --backend cpu --out scores.parquet
    kernelharness score --pairs pairs.parquet --backend cuda --out scores.parquet --repeats 5

Input is two folders whose files pair up by name (KernelBench format: a reference `Model`
and a candidate `ModelNew`), or a Parquet file of pairs. Output is the result table
(RESULT_SCHEMA, one row per pair) and a summary of its facts: compiled, correct under the
harness's strict check, deception flags, and faster with confidence (the speedup interval's
lower end above each threshold). Judging rows under other protocols (KernelBench's own
tolerances) is the caller's: `dicepipe score` prints those. `--settings` reads a YAML file
with `measure:` and `run:` sections (schema.yaml; a pipeline's params.yaml `harness:`
section is one). Re-running with the same `--out` resumes.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from .errors import HarnessError

log = logging.getLogger("kernelharness")


def add_score_arguments(parser, cache_default: str) -> None:
    """What to score and how often: this command's and `dicepipe score`'s arguments."""
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
    parser.add_argument("--cache-dir", default=None, help=f"build cache (default: {cache_default})")
    parser.add_argument("--remeasure", action="store_true",
                        help="measure every kernel again instead of reusing the rows --out "
                             "holds (also: DICEPIPE_REMEASURE=1)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kernelharness", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    score = sub.add_parser("score", help="measure kernels against their references")
    add_score_arguments(score, cache_default="run.cache_dir of --settings")
    score.add_argument("--settings", default=None,
                       help="YAML with `measure:` and `run:` (default: schema.yaml's defaults)")
    score.add_argument("-v", "--verbose", action="store_true")
    return parser


def read_settings(path: str | None):
    import yaml

    from .settings import HarnessSettings

    if path is None:
        return {}
    try:
        values = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise HarnessError(f"--settings {path}: cannot be read as YAML ({exc}).") from exc
    if not isinstance(values, dict):
        raise HarnessError(f"--settings {path}: expected a mapping with `measure:` and `run:`.")
    values = values.get("harness", values)  # a pipeline's params.yaml works as it is
    HarnessSettings.from_params(values)  # refuses unknown keys, naming them
    return values


def summary_lines(rows: list[dict], thresholds: list[float]) -> list[str]:
    """The facts of the rows, counted: no protocol applied beyond the strict check's own."""
    from .programs import names_text

    failed = [r["job_id"] for r in rows if r.get("error_phase") == "reference"]
    scored = [r for r in rows if r.get("error_phase") != "reference"]
    lines = [f"{len(rows)} kernels: {sum(bool(r['compiled']) for r in rows)} compiled"]
    if failed:
        lines.append(f"{len(failed)} references failed on their own (left out below): "
                     f"{names_text(failed)}")
    correct = [r for r in scored if r["compiled"] and r["correct"]]
    robust = [r for r in correct if r["correct_robust"]]
    lines.append(f"{len(correct)}/{len(scored)} correct (strict check), {len(robust)} of them "
                 "without deception flags")
    for p in thresholds:
        faster = sum(r["speedup_low"] is not None and r["speedup_low"] > p for r in robust)
        lines.append(f"faster than {p:g}x with confidence (interval above {p:g}), robust: "
                     f"{faster}/{len(scored)}")
    flags = {k: sum(bool(r[k]) for r in rows) for k in (rows[0] if rows else {})
             if k.startswith("flag_")}
    shown = ", ".join(f"{k[5:]}={v}" for k, v in flags.items() if v)
    lines.append(f"deception flags: {shown or 'none'}")
    return lines


def score(args) -> int:
    from . import HarnessSession, HarnessSettings, stored_results
    from .programs import FolderJobs, load_folder_jobs, load_pairs_jobs, unpaired_lines

    if args.candidates and not args.references:
        raise HarnessError("--candidates needs --references (the folder of reference programs "
                           "with the same file names).")
    if args.candidates:
        found = load_folder_jobs(Path(args.references), Path(args.candidates), args.backend)
    else:
        found = FolderJobs(jobs=load_pairs_jobs(Path(args.pairs), args.backend))
    settings = HarnessSettings.from_params(read_settings(args.settings), repeats=args.repeats,
                                           decision_thresholds=args.thresholds,
                                           cache_dir=args.cache_dir)
    store = stored_results(None, args.out, settings)
    with HarnessSession(settings) as session:
        table = session.evaluate(found.jobs, results_path=store, progress=True,
                                 unrun=found.unreadable, remeasure=args.remeasure)
        for line in session.last_summary.lines():
            print(line)
    for line in summary_lines(table.to_pylist(), args.thresholds) + unpaired_lines(found):
        print(line)
    print(f"results: {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return score(args)
    except HarnessError as exc:
        log.error("%s", exc)
        return 2
    except KeyboardInterrupt:
        log.error("interrupted; rows already measured are kept in --out and reused when re-run")
        return 130


if __name__ == "__main__":
    sys.exit(main())
