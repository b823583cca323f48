"""The tiny scale's learning chain (assemble -> sft -> rl_infill -> rl_e2e) over the splits
that verify's timings can give and over RL seeds, at each RL learning rate asked for.

Which seed chains assemble keeps depends on their measured speedups, several of which sit
near the 2.0x threshold, so two machines (or two runs on one) can train on different
splits. The tiny run must learn on any of them (tests/test_pipeline.py::learning_failures);
this measures how often each learning rate does. Each point copies a finished tiny
workspace (its verify measurements are reused, nothing is re-measured), sets the threshold,
the learning rate and the seed in its params.yaml, and runs Snakemake to rl_e2e.

    snakemake --cores 2 metrics/rl_e2e/tiny/summary.json      # once, in the repo
    python bench/tiny_rl_sweep.py --workspace . --jobs 2 --out bench/results_tiny_rl_sweep.json

Per point it records the split sizes, each RL stage's updates, groups kept, validation
rewards (chains right of the held-out ones, before the first step and every
eval_every_steps) and selected step, and whether the stage learned: a step after 0
selected (its `val` at least the one before, so the output is not the input's weights).
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

SKIP = {".git", ".venv", "results", "models", "logs", "metrics", "docs", "tests", "bench",
        ".dvc", "reports"}
STAGES = ("rl_infill", "rl_e2e")
WHAT = ("the tiny chain from assemble to rl_e2e, per point: the split a speedup threshold gives (verify's "
        "measurements reused), the RL learning rate and the RL seed; `learned`: a step after 0 selected")


def _copy_workspace(src: Path, dest: Path) -> None:
    for entry in src.iterdir():
        if entry.name in SKIP or entry.name == ".cache":
            continue
        if entry.is_dir():
            ignore = shutil.ignore_patterns("log", "locks", "incomplete", "__pycache__")
            shutil.copytree(entry, dest / entry.name, symlinks=True, ignore=ignore)
        else:
            shutil.copy2(entry, dest / entry.name)
    cache = (src / ".cache").resolve()
    cache.mkdir(exist_ok=True)
    (dest / ".cache").symlink_to(cache)  # harness builds shared: a kernel seen before never rebuilds


def run_point(workspace: Path, threshold: float, learning_rate: float, seed: int) -> dict:
    point = {"speedup_threshold": threshold, "learning_rate": learning_rate, "seed": seed}
    with tempfile.TemporaryDirectory(prefix="tiny_rl_sweep_") as tmp:
        ws = Path(tmp)
        _copy_workspace(workspace, ws)
        params = yaml.safe_load((ws / "params.yaml").read_text())
        params["assemble"]["speedup_threshold"] = threshold
        params["rl"]["overrides"]["tiny"].update(learning_rate=learning_rate, seed=seed)
        (ws / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        done = subprocess.run(["snakemake", "--cores", "1", "--", "metrics/rl_e2e/tiny/summary.json"],
                              check=False, cwd=ws, capture_output=True, text=True)
        if done.returncode:
            return {**point, "error": (done.stdout + done.stderr)[-2000:]}
        if "rule verify:" in done.stdout + done.stderr:
            return {**point, "error": "verify ran again: the workspace's measurements were not reused"}
        stats = json.loads((ws / "data/cuke/seed/stats.json").read_text())
        point["splits"] = stats["split_sizes"]
        for stage in STAGES:
            summary = json.loads((ws / f"metrics/{stage}/tiny/summary.json").read_text())
            val = {int(k): v for k, v in summary["val_rewards"].items()}
            point[stage] = {
                "updates": summary["updates_total"], "groups_kept": summary["groups_kept_total"],
                "val_tasks": summary["val_tasks"],
                "val_right": [round(val[k] * summary["val_tasks"]) for k in sorted(val)],
                "best_step": summary["best_step"], "learned": summary["best_step"] > 0,
            }
            right = point[stage]["val_right"]
            after = max(right[1:], default=right[0])
            point[stage].update(val_rose=after > right[0], val_fell_throughout=after < right[0])
    return point


def _machine() -> str:
    names = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
             if line.startswith("model name")] if Path("/proc/cpuinfo").is_file() else []
    return f"{os.cpu_count()} cores" + (f", {names[0]}" if names else "")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workspace", type=Path, default=Path("."),
                        help="a checkout whose tiny chain has run through verify (data/verify/seed)")
    parser.add_argument("--thresholds", type=float, nargs="+", default=[1.5, 2.0, 2.5])
    parser.add_argument("--learning-rates", type=float, nargs="+", default=[1e-4, 3e-5])
    parser.add_argument("--seeds", type=int, nargs="+", default=[10086, 1])
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="points run at once, one core each")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--note", default="", help="where the workspace's measurements came from")
    args = parser.parse_args(argv)
    workspace = args.workspace.resolve()
    if not (workspace / "data/verify/seed/measurements.parquet").is_file():
        sys.exit(f"{workspace} has no data/verify/seed/measurements.parquet: run "
                 "`snakemake --cores 2 metrics/rl_e2e/tiny/summary.json` there first")
    grid = list(itertools.product(args.thresholds, args.learning_rates, args.seeds))
    with ThreadPoolExecutor(args.jobs) as pool:
        points = list(pool.map(lambda g: run_point(workspace, *g), grid))
    by_rate = {}
    for rate in args.learning_rates:
        runs = [p for p in points if p["learning_rate"] == rate and "error" not in p]
        by_rate[str(rate)] = {
            "points": len(runs),
            "stages_learned": sum(p[s]["learned"] for p in runs for s in STAGES),
            "stages": len(runs) * len(STAGES),
            "runs_where_both_learned": sum(all(p[s]["learned"] for s in STAGES) for p in runs),
            "stages_val_rose": sum(p[s]["val_rose"] for p in runs for s in STAGES),
            "stages_val_below_before_at_every_validation": sum(
                p[s]["val_fell_throughout"] for p in runs for s in STAGES),
        }
    record = {"what": WHAT, "command": "python bench/tiny_rl_sweep.py " + " ".join(argv or sys.argv[1:]),
              "workspace": args.note, "machine": _machine(), "date": datetime.date.today().isoformat(),
              "summary": by_rate, "points": points}
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    for p in points:
        if "error" in p:
            print(p["speedup_threshold"], p["learning_rate"], p["seed"], "ERROR", p["error"][-300:])
            continue
        print(f"threshold {p['speedup_threshold']} lr {p['learning_rate']:g} seed {p['seed']}: "
              f"splits {p['splits']} | " + " | ".join(
                  f"{s} val {p[s]['val_right']} best {p[s]['best_step']} upd {p[s]['updates']}"
                  for s in STAGES))
    print(json.dumps(by_rate, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
