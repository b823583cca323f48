"""Harness benchmark: a second evaluation of already-built sources (cpu; a decision goal of
bench/README.md "Harness CPU decision goals").

Evaluates every (reference, kernel) pair of the shipped corpus twice with a cold build cache
(params.yaml's harness settings, repeats 1): the first run extracts, builds (precompiled
header first) and measures; the second finds every build and extraction in the cache and
only measures. Reports both wall times and their ratio (goal: second < 10% of first).

    python bench/harness_cpu_cache.py --corpus data/seed/corpus --out cache.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow"))

from dicepipe.config import load_params  # noqa: E402
from kernelharness import HarnessSettings, Job, evaluate  # noqa: E402


def corpus_jobs(corpus: Path, limit: int | None) -> list[Job]:
    jobs = []
    for cand in sorted((corpus / "kernels").glob("*.py")):
        ref = corpus / "reference" / cand.name
        if ref.is_file():
            jobs.append(Job(cand.stem, ref.read_text(), cand.read_text(), "cpu"))
    return jobs[:limit]


def timed_run(jobs: list[Job], settings: HarnessSettings) -> tuple[float, list[dict]]:
    start = time.monotonic()
    rows = evaluate(jobs, settings, progress=False).to_pylist()
    return time.monotonic() - start, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default="data/seed/corpus")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--no-pch", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    params = load_params(ROOT / "params.yaml")
    cache = Path(tempfile.mkdtemp(prefix="harness_cache_bench_", dir=ROOT / ".cache"))
    try:
        settings = HarnessSettings.from_params(params["harness"], cache_dir=cache)
        if args.no_pch:
            settings = dataclasses.replace(settings, use_pch=False)
        jobs = corpus_jobs(Path(args.corpus), args.limit)
        first_s, first = timed_run(jobs, settings)
        second_s, second = timed_run(jobs, settings)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    report = {
        "machine": platform.node(), "cores": os.cpu_count(), "load_avg": os.getloadavg(),
        "command": " ".join(sys.argv), "jobs": len(jobs), "use_pch": settings.use_pch,
        "first_s": round(first_s, 1), "second_s": round(second_s, 1),
        "second_over_first": round(second_s / first_s, 4),
        "first_build_s_total": round(sum(r["wall_build_s"] for r in first), 1),
        "second_builds_cached": f"{sum(r['builds_cached'] for r in second)}"
                                f"/{sum(r['builds_total'] for r in second)}",
        "correct": f"{sum(r['correct'] for r in second)}/{len(second)}",
        "verdicts_same": [r["correct"] for r in first] == [r["correct"] for r in second],
        "first_failures": {r["job_id"]: {"error": (r["error"] or "")[-1500:],
                                         "log": (r["compile_log_tail"] or "")[-1500:]}
                           for r in first if not r["correct"]},
    }
    print(json.dumps(report, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
