"""Build scheduling: a build's main.cpp takes its CPU slot before its cuda unit, or not.

The harness's real code path (`compile_steps.run_steps`, CPU slots shared through lock files)
runs builds made of stand-in commands (`sleep`, so the figures measure the scheduling, not a
compiler): every build has a host unit (main.cpp) and a cuda unit (cuda.cu); in the failing
builds main.cpp fails after `--host-s` seconds (bindings that name an undeclared function:
most failed builds of the real corpus), in the others both units succeed. `--builders`
builds run at a time over `--slots` slots (the harness runs one builder per slot, so a
build's two units compete with the other builds' for them).

Two modes on the same builds, alternated over `--rounds` rounds:
  any-order   a unit takes whichever slot frees first (the harness before the build slots were ordered)
  host-first  a build's cuda unit takes no slot while its main.cpp still waits for one

    python harness/bench/build_slots.py --out build_slots.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kernelharness.compilation import compile_steps

NINJA = """ninja_required_version = 1.3

rule compile
  command = sleep {host_s} {host_tail}

rule cuda_compile
  command = touch cuda_started && sleep {cuda_s}

rule link
  command = touch $out

build cuda.o: cuda_compile cuda.cu
build main.o: compile main.cpp
build m.so: link main.o cuda.o
"""


def make_builds(n_fail: int, n_ok: int, host_s: float, cuda_s: float) -> list:
    """Failing and succeeding builds interleaved (a stream of sampled kernels)."""
    kinds = ["fail"] * n_fail + ["ok"] * n_ok
    order = [kinds[i] for i in sorted(range(len(kinds)), key=lambda i: (i * 7919) % len(kinds))]
    builds = []
    for index, kind in enumerate(order):
        tail = "&& echo 'main.cpp: error: undeclared' >&2 && exit 1" if kind == "fail" else ""
        builds.append((index, kind, NINJA.format(host_s=host_s, cuda_s=cuda_s, host_tail=tail)))
    return builds


def run_mode(builds: list, work: Path, builders: int, host_first: bool) -> dict:
    """Every build once, `builders` at a time; wall per build and for the whole set."""
    real = compile_steps._yields_to_host
    if not host_first:
        compile_steps._yields_to_host = lambda: False
    try:
        def one(build) -> dict:
            index, kind, text = build
            folder = work / f"b{index}"
            folder.mkdir(parents=True)
            (folder / "build.ninja").write_text(text)
            t0 = time.monotonic()
            try:
                compile_steps.run_steps(folder / "build.ninja", work / "cache")
                ok = True
            except compile_steps.StepError:
                ok = False
            return {"kind": kind, "ok": ok, "wall_s": time.monotonic() - t0,
                    "cuda_started": (folder / "cuda_started").exists()}

        t0 = time.monotonic()
        with ThreadPoolExecutor(max_workers=builders) as pool:
            rows = list(pool.map(one, builds))
        total = time.monotonic() - t0
    finally:
        compile_steps._yields_to_host = real

    def walls(kind: str) -> list[float]:
        return [r["wall_s"] for r in rows if r["kind"] == kind]

    fails = [r for r in rows if r["kind"] == "fail"]
    assert all(r["ok"] == (r["kind"] == "ok") for r in rows), rows
    return {"mode": "host-first" if host_first else "any-order", "wall_s": round(total, 2),
            "fail_build_mean_s": round(statistics.mean(walls("fail")), 2),
            "fail_build_max_s": round(max(walls("fail")), 2),
            "ok_build_mean_s": round(statistics.mean(walls("ok")), 2),
            "fail_builds_whose_cuda_started": sum(r["cuda_started"] for r in fails)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--builders", type=int, default=4)
    parser.add_argument("--fail", type=int, default=8, help="builds whose main.cpp fails")
    parser.add_argument("--ok", type=int, default=8, help="builds that succeed")
    parser.add_argument("--host-s", type=float, default=0.5, help="main.cpp's compile time")
    parser.add_argument("--cuda-s", type=float, default=4.0, help="cuda.cu's compile time")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    os.environ[compile_steps.SLOTS_ENV] = str(args.slots)
    results = []
    with tempfile.TemporaryDirectory(prefix="build_slots_") as tmp:
        for round_ in range(args.rounds):
            for host_first in ((False, True) if round_ % 2 == 0 else (True, False)):
                work = Path(tmp) / f"r{round_}_{int(host_first)}"
                builds = make_builds(args.fail, args.ok, args.host_s, args.cuda_s)
                row = run_mode(builds, work, args.builders, host_first)
                row["round"] = round_
                results.append(row)
                print(json.dumps(row), flush=True)
    summary = {}
    for mode in ("any-order", "host-first"):
        mine = [r for r in results if r["mode"] == mode]
        summary[mode] = {k: round(statistics.mean(r[k] for r in mine), 2)
                         for k in ("wall_s", "fail_build_mean_s", "fail_build_max_s",
                                   "ok_build_mean_s", "fail_builds_whose_cuda_started")}
    summary["wall_ratio_host_first_over_any_order"] = round(
        summary["host-first"]["wall_s"] / summary["any-order"]["wall_s"], 3)
    print(json.dumps(summary, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "machine": platform.node(),
                                              "rounds": results, "summary": summary},
                                             indent=1) + "\n")


if __name__ == "__main__":
    main()
