"""Harness benchmark: timing noise and verdict error rates (the harness goals "Noise and verdicts").

Three measurements, all through `evaluate`, reference and candidate in the same process:
  unchanged  a candidate that does exactly the reference's work, measured `--jobs` times
             (one repeat each): how often it is judged faster than 1.0 (interval above 1.0),
             and, beside it, how often KernelBench's method (mean of 100 event-timed calls on
             one reused input, reference and candidate timed one after the other) says > 1.0;
  faster     a candidate that does 19 of the reference's 20 identical passes (5.3% faster by
             construction, same output): how often it is judged faster than 1.0;
  suite      every reference program of a suite against itself (`ModelNew = Model`; the
             static flags fire, which does not affect timing): p95 of |speedup - 1|, for the
             first repeat alone and pooled over all repeats.

    python harness/bench/harness_noise.py --backend cpu --suite data/seed/benchmark --out noise.json
    python harness/bench/harness_noise.py --backend cuda --kernelbench PARQUET --level 1 --out n.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import platform
import statistics
import sys
import time
from pathlib import Path

from kernelharness import HarnessSettings, Job, evaluate

PASSES_PROGRAM = '''
import torch
import torch.nn as nn

class {cls}(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        out = x
        for _ in range({passes}):
            out = torch.maximum(out, x)
        return out

def get_inputs():
    return [torch.rand({numel})]

def get_init_inputs():
    return []
'''


def passes_pair(ref_passes: int, cand_passes: int, numel: int) -> tuple[str, str]:
    ref = PASSES_PROGRAM.format(cls="Model", passes=ref_passes, numel=numel)
    cand = PASSES_PROGRAM.format(cls="ModelNew", passes=cand_passes, numel=numel)
    return ref, cand


def unchanged_candidate(reference_code: str) -> str:
    return reference_code + "\n\nModelNew = Model\n"


def suite_references(args) -> list[tuple[str, str]]:
    if args.kernelbench:
        import pyarrow.parquet as pq

        rows = pq.read_table(args.kernelbench).to_pylist()
        rows = [r for r in rows if r["level"] == args.level]
        rows.sort(key=lambda r: r["problem_id"])
        named = [(f"L{r['level']}_{r['name']}", r["code"]) for r in rows]
        return named[:: args.every][: args.limit]
    found = []
    for folder in args.suite:
        for path in sorted(Path(folder).rglob("*.py")):
            found.append((f"{path.parent.name}_{path.stem}", path.read_text()))
    return found[: args.limit]


def rate(values: list[bool]) -> float:
    return sum(values) / len(values) if values else float("nan")


def p95(values: list[float]) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]


def evaluate_chunked(jobs: list, settings: HarnessSettings, args) -> list[dict]:
    """Evaluate in chunks until the time budget is spent (a capped run still reports)."""
    start = time.monotonic()
    rows: list[dict] = []
    for i in range(0, len(jobs), args.chunk):
        if rows and time.monotonic() - start > args.budget_s:
            break
        rows += evaluate(jobs[i:i + args.chunk], settings, progress=args.progress).to_pylist()
    return rows


def run_synthetic(args, base: HarnessSettings) -> dict:
    numel = args.numel
    same_ref, same_cand = passes_pair(20, 20, numel)
    fast_ref, fast_cand = passes_pair(20, 19, numel)
    jobs = []
    # Each job's candidate carries its own number: identical jobs would be measured once and
    # copied (the harness evaluates each content key once), leaving one sample, not `jobs`.
    for i in range(args.jobs):  # interleaved, so a capped run has both kinds
        tag = f"\n# noise sample {i}\n"
        jobs.append(Job(f"unchanged_{i:04d}", same_ref, same_cand + tag, args.backend))
        jobs.append(Job(f"faster_{i:04d}", fast_ref, fast_cand + tag, args.backend))
    # The repeat rule decides "faster than 1.0": a clear case stops after one repeat, an
    # unchanged kernel is measured `--synthetic-repeats` times and its trials pooled.
    settings = dataclasses.replace(base, kernelbench_timing=True, repeats=args.synthetic_repeats,
                                   decision_thresholds=(1.0,))
    start = time.monotonic()
    rows = evaluate_chunked(jobs, settings, args)
    unchanged = [r for r in rows if r["job_id"].startswith("unchanged") and r["correct"]]
    faster = [r for r in rows if r["job_id"].startswith("faster") and r["correct"]]
    return {
        "numel": numel,
        "jobs_each": args.jobs,
        "unchanged_measured": len(unchanged),
        "unchanged_judged_faster_rate": rate([r["speedup_low"] > 1.0 for r in unchanged]),
        "unchanged_judged_slower_rate": rate([r["speedup_high"] < 1.0 for r in unchanged]),
        "unchanged_kernelbench_faster_rate": rate([r["kb_speedup"] > 1.0 for r in unchanged]),
        "unchanged_p95_abs_dev": p95([abs(r["speedup_median"] - 1) for r in unchanged]),
        "unchanged_p95_abs_dev_first_repeat": p95([abs(r["speedup_repeats"][0] - 1)
                                                   for r in unchanged]),
        "unchanged_mean_repeats": statistics.fmean(r["num_repeats"] for r in unchanged)
        if unchanged else None,
        "unchanged_kernelbench_p95_abs_dev": p95([abs(r["kb_speedup"] - 1) for r in unchanged]),
        "unchanged_median_ref_ms": statistics.median(r["ref_runtime_ms"][0] for r in unchanged)
        if unchanged else None,
        "faster_measured": len(faster),
        "faster_judged_faster_rate": rate([r["speedup_low"] > 1.0 for r in faster]),
        "faster_judged_faster_first_repeat_rate": rate([r["speedup_low_repeats"][0] > 1.0
                                                        for r in faster]),
        "faster_mean_repeats": statistics.fmean(r["num_repeats"] for r in faster)
        if faster else None,
        "faster_median_speedup": statistics.median(r["speedup_median"] for r in faster)
        if faster else None,
        "faster_kernelbench_faster_rate": rate([r["kb_speedup"] > 1.0 for r in faster]),
        "seconds": round(time.monotonic() - start, 1),
    }


def run_suite(args, base: HarnessSettings) -> dict:
    refs = suite_references(args)
    jobs = [Job(name, code, unchanged_candidate(code), args.backend) for name, code in refs]
    settings = dataclasses.replace(base, repeats=args.repeats, decision_thresholds=(1.0,))
    start = time.monotonic()
    rows = evaluate_chunked(jobs, settings, args)
    timed = [r for r in rows if r["correct"] and r["speedup_median"] is not None]
    first = [abs(r["speedup_repeats"][0] - 1) for r in timed]
    pooled = [abs(r["speedup_median"] - 1) for r in timed]
    return {
        "problems": len(refs),
        "evaluated": len(rows),
        "timed": len(timed),
        "not_timed": {r["job_id"]: (r["error"] or "")[-200:] for r in rows if r not in timed},
        "repeats": args.repeats,
        "p95_abs_dev_first_repeat": p95(first),
        "p95_abs_dev_pooled": p95(pooled),
        "median_abs_dev_pooled": statistics.median(pooled) if pooled else None,
        "judged_faster_rate_pooled": rate([r["speedup_low"] > 1.0 for r in timed]),
        "judged_faster_rate_first_repeat": rate([r["speedup_low_repeats"][0] > 1.0
                                                 for r in timed]),
        "launch_bound": sum(r["launch_bound"] for r in timed),
        "p95_abs_dev_not_launch_bound": p95([abs(r["speedup_median"] - 1) for r in timed
                                             if not r["launch_bound"]]),
        "per_problem": {r["job_id"]: [round(s, 5) for s in r["speedup_repeats"]] for r in timed},
        "seconds": round(time.monotonic() - start, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["cpu", "cuda"], required=True)
    parser.add_argument("--jobs", type=int, default=200, help="synthetic jobs of each kind")
    parser.add_argument("--numel", type=int, default=None)
    parser.add_argument("--suite", nargs="*", default=[], help="folders of reference programs")
    parser.add_argument("--kernelbench", default=None, help="KernelBench parquet (levels 1-3)")
    parser.add_argument("--level", type=int, default=1)
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--every", type=int, default=1, help="take every k-th problem")
    parser.add_argument("--repeats", type=int, default=3, help="repeats for the suite part")
    parser.add_argument("--synthetic-repeats", type=int, default=1,
                        help="up to this many repeats per synthetic job (repeat rule at 1.0)")
    parser.add_argument("--cpu-clock", choices=["cpu", "wall"], default="cpu")
    parser.add_argument("--cpu-threads", type=int, default=1, help="0 = one per core")
    parser.add_argument("--timing-trials", type=int, default=None,
                        help="trials per repeat (default: the harness's, 50 cuda / 400 cpu)")
    parser.add_argument("--cpu-floor", type=float, default=None,
                        help="timing_noise_floor_cpu (default: the harness's)")
    parser.add_argument("--cache-dir", default=".cache/dicepipe/builds")
    parser.add_argument("--skip-synthetic", action="store_true")
    parser.add_argument("--progress", action="store_true")
    parser.add_argument("--chunk", type=int, default=20, help="jobs per evaluate call")
    parser.add_argument("--budget-s", type=float, default=1e9,
                        help="start no new chunk after this many seconds (per part)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.numel is None:
        args.numel = 2**25 if args.backend == "cuda" else 2**20
    base = HarnessSettings.with_defaults(cache_dir=args.cache_dir, build_workers=2, use_pch=False,
                                         cpu_clock=args.cpu_clock, cpu_threads=args.cpu_threads)
    trials_key = "timing_trials_cpu" if args.backend == "cpu" else "timing_trials"
    if args.timing_trials is not None:
        base = dataclasses.replace(base, **{trials_key: args.timing_trials})
    if args.cpu_floor is not None:
        base = dataclasses.replace(base, timing_noise_floor_cpu=args.cpu_floor)
    report = {"backend": args.backend, "machine": platform.node(), "cpu": platform.processor(),
              "settings": {"timing_trials": getattr(base, trials_key),
                           "interval_confidence": base.interval_confidence,
                           "timing_noise_floor": base.timing_noise_floor,
                           "timing_noise_floor_cpu": base.timing_noise_floor_cpu,
                           "cpu_clock": args.cpu_clock, "cpu_threads": args.cpu_threads,
                           "synthetic_repeats": args.synthetic_repeats},
              "command": " ".join(sys.argv)}
    if not args.skip_synthetic and args.jobs > 0:
        report["synthetic"] = run_synthetic(args, base)
        print(json.dumps(report["synthetic"], indent=1), flush=True)
        Path(args.out).write_text(json.dumps(report, indent=1))
    if args.suite or args.kernelbench:
        report["suite"] = run_suite(args, base)
        summary = {k: v for k, v in report["suite"].items() if k != "per_problem"}
        print(json.dumps(summary, indent=1), flush=True)
    Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
