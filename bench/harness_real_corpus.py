"""Harness trust on real kernels: score a corpus of public KernelBench CUDA kernels
(bench/README.md "Harness on real kernels").

The corpus (kept out of the repository, e.g. .carry/realcorpus/) holds candidates/<key>.py,
references/<key>.py with the same file names, and manifest.jsonl (key, source, level, problem,
provenance, notes). Every pair runs through the harness once (cuda, repeats 1, params.yaml's
harness settings), then each row is judged under every tolerance protocol, plain and robust,
through dicepipe.judgement; nothing is re-measured to change a protocol.

    PYTHONUNBUFFERED=1 PYTHONPATH=workflow python3 bench/harness_real_corpus.py \
        --corpus .carry/realcorpus --out $OUT/realcorpus
    python3 bench/harness_real_corpus.py --corpus .carry/realcorpus --out x --summarize-only

Writes <out>/per_kernel.parquet and .csv (one row per kernel: manifest fields, the result row,
the verdict per protocol, the flags set) and <out>/summary.txt / summary.json: compiled, correct
per protocol (plain and robust), rows per flag, launch-bound rows, per source, and every
flagged kernel with its flags, so a person can read each one and judge the flag.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

from dicepipe.judgement import BUILTIN_PROTOCOLS, Protocol, is_flagged, judge, named_protocol

ROOT = Path(__file__).resolve().parents[1]

PROFILE_NAMES = ("kernelbench", "kernelbench_v0", "release_reward", "strict")
# Manifest fields copied beside each result row (the rest stays in manifest.jsonl).
MANIFEST_FIELDS = ("source", "repo", "commit", "path", "level", "problem_id", "problem_name",
                   "label", "expected", "model", "static_hints", "notes")


# ---------------------------------------------------------------- judging (pure functions)

def flags_set(row: Mapping) -> list[str]:
    return sorted(name for name, value in row.items() if name.startswith("flag_") and value)


def correct_under(row: Mapping, protocol: Protocol) -> tuple[bool, str]:
    """(correct under the protocol, how it was decided), robustness aside.

    Rows with `tolerance_needed` go through the one verdict function. Older rows (a harness before
    it recorded the tolerance each output needs) only carry `max_abs_error`, an absolute error:
    at most the protocol's fp32 tolerance is enough for allclose (atol alone covers it), so the
    fallback never accepts a row the real rule would reject, only misses some that a relative
    tolerance would accept.
    """
    if "tolerance_needed" in row:
        return judge(row, protocol=protocol, robust=False) == "accepted", "tolerance_needed"
    error = row.get("max_abs_error")
    if not row.get("compiled") or error is None or not math.isfinite(float(error)):
        return False, "max_abs_error"
    if row.get("error_phase") not in (None, "correct", "timing"):
        return False, "max_abs_error"
    return float(error) <= protocol.allowed(row.get("output_precision")), "max_abs_error"


def judge_row(row: Mapping, protocols: Mapping[str, Protocol]) -> dict:
    """The derived columns of one per-kernel row."""
    flagged = is_flagged(row)
    out = {"flags": ",".join(f[5:] for f in flags_set(row)), "flagged": flagged}
    for name, protocol in protocols.items():
        ok, basis = correct_under(row, protocol)
        out[f"correct_{name}"] = ok
        out[f"correct_{name}_robust"] = ok and not flagged
        out["correct_basis"] = basis
    return out


def summarize(rows: Sequence[Mapping], profile_names: Sequence[str]) -> dict:
    """Counts over judged per-kernel rows (judge_row's columns merged into each result row)."""
    def block(subset: list[Mapping]) -> dict:
        counts = {"kernels": len(subset),
                  "compiled": sum(bool(r.get("compiled")) for r in subset),
                  # loaded and ran, though a build it asked for failed: the candidate caught
                  # the failed load_inline itself (its fallback then did the work)
                  "compiled_build_failed": sum(bool(r.get("compiled"))
                                               and bool(r.get("compile_log_tail"))
                                               for r in subset),
                  "launch_bound": sum(bool(r.get("launch_bound")) for r in subset),
                  "flagged": sum(bool(r.get("flagged")) for r in subset)}
        for name in profile_names:
            counts[f"correct_{name}"] = sum(bool(r[f"correct_{name}"]) for r in subset)
            counts[f"correct_{name}_robust"] = sum(bool(r[f"correct_{name}_robust"]) for r in subset)
        return counts

    flag_names = sorted({k for r in rows for k in r if k.startswith("flag_")})
    by_source: dict[str, list[Mapping]] = {}
    for r in rows:
        by_source.setdefault(str(r.get("source") or "?"), []).append(r)
    differ = [r["job_id"] for r in rows
              if len({bool(r[f"correct_{n}"]) for n in profile_names}) > 1]
    flagged_rows = [{"job_id": r["job_id"], "flags": r["flags"],
                     "correct_loosest": any(bool(r[f"correct_{n}"]) for n in profile_names),
                     "source": r.get("source"), "problem": r.get("problem_name"),
                     "label": r.get("label"), "static_hints": r.get("static_hints"),
                     "error": first_line(r.get("error"))}
                    for r in rows if r.get("flagged")]
    expected_mismatch = [r["job_id"] for r in rows if r.get("expected") == "correct"
                         and not any(bool(r[f"correct_{n}"]) for n in profile_names)]
    return {"total": block(list(rows)),
            "by_source": {s: block(v) for s, v in sorted(by_source.items())},
            "by_flag": {f: sum(bool(r.get(f)) for r in rows) for f in flag_names},
            "correct_basis": dict(Counter(str(r.get("correct_basis")) for r in rows)),
            "profiles_disagree": sorted(differ),
            "source_says_correct_harness_not": sorted(expected_mismatch),
            "error_phases": dict(Counter(str(r.get("error_phase")) for r in rows
                                         if r.get("error_phase"))),
            "flagged": sorted(flagged_rows, key=lambda f: f["job_id"])}


def first_line(text) -> str | None:
    if not text:
        return None
    lines = [line for line in str(text).splitlines() if line.strip()]
    return lines[-1][:200] if lines else None


def format_summary(summary: Mapping, profile_names: Sequence[str]) -> list[str]:
    def counts_line(label: str, c: Mapping) -> str:
        parts = [f"{c['compiled']}/{c['kernels']} compiled"
                 + (f" ({c['compiled_build_failed']} of them past a failed build of their own)"
                    if c.get("compiled_build_failed") else "")]
        for n in profile_names:
            parts.append(f"{n}: {c[f'correct_{n}']} correct, {c[f'correct_{n}_robust']} robust")
        parts.append(f"{c['flagged']} flagged, {c['launch_bound']} launch-bound")
        return f"{label}: " + "; ".join(parts)

    lines = [counts_line("all", summary["total"])]
    lines += [counts_line(f"  {s}", c) for s, c in summary["by_source"].items()]
    shown = ", ".join(f"{k[5:]}={v}" for k, v in summary["by_flag"].items() if v)
    lines.append(f"rows per flag: {shown or 'none'}")
    lines.append(f"correctness decided from: {summary['correct_basis']}")
    if summary["error_phases"]:
        lines.append(f"rows with an error, by phase: {summary['error_phases']}")
    if summary["profiles_disagree"]:
        lines.append(f"protocols disagree on {len(summary['profiles_disagree'])}: "
                     + ", ".join(summary["profiles_disagree"]))
    if summary["source_says_correct_harness_not"]:
        lines.append("the source reports correct, no protocol here does: "
                     + ", ".join(summary["source_says_correct_harness_not"]))
    lines.append(f"flagged kernels ({len(summary['flagged'])}):")
    for f in summary["flagged"]:
        extra = f" label={f['label']}" if f.get("label") else ""
        lines.append(f"  {f['job_id']}: {f['flags']} (correct={f['correct_loosest']}{extra}; "
                     f"{f['problem']}; hints={f['static_hints']})")
    return lines


# ---------------------------------------------------------------- corpus and harness (I/O)

def read_manifest(corpus: Path) -> dict[str, dict]:
    path = corpus / "manifest.jsonl"
    if not path.is_file():
        raise SystemExit(f"{path}: no such file. Expected the corpus folder with manifest.jsonl, "
                         "candidates/ and references/.")
    return {e["key"]: e for e in map(json.loads, path.read_text().splitlines()) if e}


def corpus_jobs(corpus: Path, references: str, sources: Sequence[str] | None,
                manifest: Mapping[str, dict], limit: int | None) -> list:
    from kernelharness import Job

    jobs = []
    for cand in sorted((corpus / "candidates").glob("*.py")):
        meta = manifest.get(cand.stem, {})
        if sources and meta.get("source") not in sources:
            continue
        ref = corpus / references / cand.name
        if not ref.is_file():  # references_source/ has no file where the source shipped none
            ref = corpus / "references" / cand.name
        jobs.append(Job(cand.stem, ref.read_text(), cand.read_text(), "cuda"))
    return jobs[:limit] if limit else jobs


def run_harness(jobs: list, settings, results_path: Path, budget_s: float | None = None,
                chunk: int = 16) -> list[dict]:
    """Rows of every job evaluated, in chunks through one warm session; with `budget_s`, no
    new chunk starts once the budget is spent (what finished is kept and resumable)."""
    from dicepipe import harness

    began = time.monotonic()
    rows: list[dict] = []
    with harness.HarnessSession(settings) as session:
        for start in range(0, len(jobs), chunk):
            if budget_s is not None and time.monotonic() - began > budget_s:
                print(f"budget of {budget_s:.0f} s spent: {len(rows)} of {len(jobs)} kernels "
                      "done (run again to resume)", flush=True)
                break
            part = session.evaluate(jobs[start:start + chunk], results_path=results_path,
                                    progress=chunk >= len(jobs))  # one call: show its builds
            rows += part.to_pylist()
            print(f"{len(rows)}/{len(jobs)} kernels at {time.monotonic() - began:.0f} s",
                  flush=True)
    return rows


def load_profiles(params: Mapping | None) -> dict[str, Protocol]:
    table = (params or {}).get("protocols") or BUILTIN_PROTOCOLS
    return {n: named_protocol(n, table) for n in PROFILE_NAMES if n in table}


def per_kernel_rows(result_rows: list[dict], manifest: Mapping[str, dict],
                    protocols: Mapping[str, Protocol]) -> list[dict]:
    rows = []
    for r in result_rows:
        meta = manifest.get(r["job_id"], {})
        row = {k: meta.get(k) for k in MANIFEST_FIELDS}
        row["static_hints"] = ",".join(meta.get("static_hints") or [])
        row.update(r)
        row.update(judge_row(r, protocols))
        rows.append(row)
    return rows


def write_outputs(rows: list[dict], summary: dict, lines: list[str], out: Path) -> None:
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    out.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist(rows)
    pq.write_table(table, out / "per_kernel.parquet")
    flat = [n for n in table.column_names if not pa.types.is_list(table.schema.field(n).type)]
    pacsv.write_csv(table.select(flat), out / "per_kernel.csv")
    (out / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    (out / "summary.txt").write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--references", default="references",
                        help="references (shared KernelBench parquet, default) or "
                             "references_source (what each source evaluated against)")
    parser.add_argument("--sources", nargs="*", help="only these manifest sources")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--results", type=Path, default=None,
                        help="harness results Parquet, resumed if present (default <out>/results.parquet)")
    parser.add_argument("--params", default=str(ROOT / "params.yaml"))
    parser.add_argument("--budget-s", type=float, default=None,
                        help="start no new chunk of kernels after this many seconds")
    parser.add_argument("--chunk", type=int, default=16,
                        help="kernels per session call (0: all in one call, builds fully "
                             "pipelined; a kill still keeps every finished row in the journal)")
    parser.add_argument("--timing-trials", type=int, default=None,
                        help="override harness.measure.timing_trials (cuda)")
    parser.add_argument("--summarize-only", action="store_true",
                        help="judge an existing results Parquet; runs nothing")
    args = parser.parse_args()

    from dicepipe.config import load_params

    params = load_params(args.params)
    protocols = load_profiles(params)
    manifest = read_manifest(args.corpus)
    results = args.results or args.out / "results.parquet"
    if args.summarize_only:
        from kernelharness.results import ResultStore

        result_rows = ResultStore.read(results)  # the journal too, if the run was cut short
    else:
        from kernelharness import HarnessSettings

        jobs = corpus_jobs(args.corpus, args.references, args.sources, manifest, args.limit)
        harness_params = {"measure": dict(params["harness"]["measure"]),
                          "run": params["harness"]["run"]}
        if args.timing_trials:
            harness_params["measure"]["timing_trials"] = args.timing_trials
        settings = HarnessSettings.from_params(harness_params, repeats=1)
        results.parent.mkdir(parents=True, exist_ok=True)
        print(f"{len(jobs)} kernels, references from {args.references}/", flush=True)
        began = time.monotonic()
        result_rows = run_harness(jobs, settings, results, args.budget_s,
                                  args.chunk or len(jobs) or 1)
        print(f"harness: {time.monotonic() - began:.0f} s", flush=True)
    rows = per_kernel_rows(result_rows, manifest, protocols)
    summary = summarize(rows, list(protocols))
    lines = format_summary(summary, list(protocols))
    write_outputs(rows, summary, lines, args.out)
    print("\n".join(lines))
    print(f"per-kernel table: {args.out / 'per_kernel.parquet'}")


if __name__ == "__main__":
    main()
