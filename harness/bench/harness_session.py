"""Harness benchmark: a session on a stream of RL-like batches vs one-shot `evaluate()` calls.

An RL step asks the harness about a batch of sampled kernels; the next step asks again. The
stream here: `--calls` batches of `--batch` candidates each; a quarter of every batch repeats
a candidate seen before (in an earlier batch, or earlier in the same one), half of the new
candidates fail to compile (an undeclared name after the torch headers, as a sampled kernel
would), the rest are right. Candidates are the affine extensions of harness_throughput.py,
each with constants of its own, so every new one is a build of its own.

Both modes run in this process, on this machine, one after the other, each on a stream of
its own (same shape, different constants, so neither reuses the other's builds); a warm-up
job builds the shared precompiled header first so neither pays for it. With --prebuild,
every candidate of both streams is built (and extracted) before either mode is timed, so
the figures compare the harness around the builds, not the compiler.
  one-shot  `evaluate(batch, settings)` per batch: workers started and stopped each call;
  session   one `HarnessSession`, `h.evaluate(batch)` per batch: workers kept warm, and
            a candidate seen in an earlier batch is not evaluated again.

    python harness/bench/harness_session.py --backend cpu --batch 8 --calls 3 --prebuild
    python harness/bench/harness_session.py --backend cuda --batch 64 --calls 4
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness_throughput import CPU_CANDIDATE, CUDA_CANDIDATE, REFERENCE

SHAPES = {"cpu": "256, 1024", "cuda": "4096, 4096"}


def candidate_pair(index: int, backend: str, fails: bool) -> tuple[str, str]:
    a, b = 1.0 + (index + 1) / 1024.0, (index + 1) / 64.0
    ref = REFERENCE.format(a=repr(a), b=repr(b), shape=SHAPES[backend])
    cand = (CUDA_CANDIDATE if backend == "cuda" else CPU_CANDIDATE).format(i=index, a=repr(a),
                                                                           b=repr(b))
    if fails:  # compiles the headers, then stops at the kernel: a typical sampled mistake
        cand = cand.replace("return y;", f"return y + undeclared_{index};")
    return ref, cand


def make_stream(calls: int, batch: int, backend: str, first_index: int, seed: int,
                repeat_fraction: float = 0.25, fail_fraction: float = 0.5) -> list[list[tuple]]:
    """Batches of (job_id, reference, candidate); ids are unique within a batch only."""
    rng = random.Random(seed)
    seen: list[tuple[str, str]] = []
    index = first_index
    stream = []
    for call in range(calls):
        n_repeat = round(batch * repeat_fraction)
        pairs = []
        for _ in range(batch - n_repeat):
            pair = candidate_pair(index, backend, rng.random() < fail_fraction)
            index += 1
            pairs.append(pair)
            seen.append(pair)
        pairs += [rng.choice(seen) for _ in range(n_repeat)]
        rng.shuffle(pairs)
        stream.append([(f"sample_{k:03d}", ref, cand) for k, (ref, cand) in enumerate(pairs)])
    return stream


def run_mode(mode: str, stream: list[list[tuple]], settings, backend: str,
             measure_speed: bool) -> dict:
    from kernelharness import HarnessSession, Job, evaluate

    per_call, measured, correct, compiled = [], 0, 0, 0
    session = HarnessSession(settings) if mode == "session" else None
    start = time.monotonic()
    try:
        for batch in stream:
            jobs = [Job(job_id, ref, cand, backend) for job_id, ref, cand in batch]
            t0 = time.monotonic()
            if session is not None:
                table = session.evaluate(jobs, progress=False, measure_speed=measure_speed)
                measured += session.last_summary.measured
            else:
                table = evaluate(jobs, settings, progress=False, measure_speed=measure_speed)
                measured += sum(1 for row in table.to_pylist() if not row["reused"])
            per_call.append(round(time.monotonic() - t0, 2))
            rows = table.to_pylist()
            correct += sum(row["correct"] for row in rows)
            compiled += sum(row["compiled"] for row in rows)
    finally:
        if session is not None:
            session.close()
    wall = time.monotonic() - start
    jobs = sum(len(b) for b in stream)
    return {"wall_s": round(wall, 1), "jobs": jobs, "jobs_per_min": round(jobs / wall * 60, 1),
            "per_call_s": per_call, "evaluated_by_a_worker": measured, "compiled": compiled,
            "correct": correct}


def prebuild(streams: dict, settings, backend: str) -> float:
    """Build and extract every distinct candidate once (correctness only, results dropped)."""
    from kernelharness import Job, evaluate

    start = time.monotonic()
    distinct = {cand: ref for stream in streams.values() for batch in stream
                for _id, ref, cand in batch}
    jobs = [Job(f"pre_{k:04d}", ref, cand, backend)
            for k, (cand, ref) in enumerate(distinct.items())]
    evaluate(jobs, settings, progress=False, measure_speed=False)
    return time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--batch", type=int, default=64, help="candidates per call")
    parser.add_argument("--calls", type=int, default=4, help="calls (RL steps) per mode")
    parser.add_argument("--correctness-only", action="store_true",
                        help="measure_speed=False (a reward that needs no speed)")
    parser.add_argument("--prebuild", action="store_true",
                        help="build every candidate before timing either mode")
    parser.add_argument("--build-workers", type=int, default=0)
    parser.add_argument("--cache-dir", default=None,
                        help="build cache (default: a fresh temporary one, removed after)")
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    args = parser.parse_args()

    from kernelharness import HarnessSettings, Job, evaluate

    scratch = None
    if args.cache_dir is None:
        scratch = Path(tempfile.mkdtemp(prefix="bench-session-"))
    cache = args.cache_dir or str(scratch / "cache")
    settings = HarnessSettings.with_defaults(cache_dir=cache, build_workers=args.build_workers)
    try:
        t0 = time.monotonic()
        ref, cand = candidate_pair(10**6, args.backend, fails=False)
        evaluate([Job("warmup", ref, cand, args.backend)], settings, progress=False)
        warmup_s = time.monotonic() - t0
        span = args.calls * args.batch
        streams = {mode: make_stream(args.calls, args.batch, args.backend,
                                     first_index=k * span, seed=1)
                   for k, mode in enumerate(("one-shot", "session"))}
        prebuild_s = prebuild(streams, settings, args.backend) if args.prebuild else 0.0
        results = {}
        for mode, stream in streams.items():
            results[mode] = run_mode(mode, stream, settings, args.backend,
                                     not args.correctness_only)
            print(mode, json.dumps(results[mode]), flush=True)
            if args.out:  # each mode as it ends: a time cap still leaves the first
                Path(args.out).parent.mkdir(parents=True, exist_ok=True)
                Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    report = {"backend": args.backend, "batch": args.batch, "calls": args.calls,
              "measure_speed": not args.correctness_only, "warmup_s": round(warmup_s, 1),
              "prebuild_s": round(prebuild_s, 1),
              "machine": platform.node(), **results,
              "speedup_session": round(results["one-shot"]["wall_s"]
                                       / max(results["session"]["wall_s"], 1e-9), 2)}
    print(json.dumps(report, indent=1))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
