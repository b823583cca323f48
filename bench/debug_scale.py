"""The debug scale's run under Snakemake, timed: each job's wall time and the GPU's busy share
and peak memory while it ran (nvidia-smi sampled every 0.5 s), then the run's learning
figures (SFT loss, each RL stage's updates, rewards and `val` before/after, the evaluation
rows). Writes one JSON record.

    python bench/debug_scale.py --cold --cores 16 --out bench/results_debug_scale_h100.json
    python bench/debug_scale.py --warm --cores 16 --out ...   # outputs removed, build cache kept

--cold removes the debug chain's outputs and the whole .cache/dicepipe (build cache, resume
stores); --warm removes the outputs and resume stores but keeps the build cache; neither
removes anything (a resumed or finished run). --deadline stops Snakemake after that many
seconds (its jobs resume on the next run, as after any kill); --until RULE stops after that
rule's jobs instead, a stage boundary. On a machine whose commands last at most 10 minutes,
the cold chain splits in two there:

    python bench/debug_scale.py --cold --cores 16 --until rl_infill --out part1.json
    python bench/debug_scale.py --cores 16 --out part2.json
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGET = "results/kernelbench_debug.csv"
OUTPUTS = ["data/ingest/debug", "data/verify/debug", "data/augment/debug", "data/cuke/debug",
           "data/benchmark/kernelbench-debug.parquet", "models/sft/debug", "models/rl_infill/debug",
           "models/rl_e2e/debug", "metrics/sft/debug", "metrics/rl_infill/debug", "metrics/rl_e2e/debug",
           "metrics/evaluate/debug", "results/kernelbench_debug", TARGET,
           "results/kernelbench_compare_debug.csv"]
RESUME_STORES = [".cache/dicepipe/resume", ".cache/dicepipe/augment/debug", "models/sft/debug.work",
                 "models/rl_infill/debug.work", "models/rl_e2e/debug.work"]


def remove(paths: list[str]) -> None:
    for rel in paths:
        path = REPO / rel
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


class GpuSampler(threading.Thread):
    """(seconds since start, utilisation %, memory used MiB) every `period` s from nvidia-smi."""

    def __init__(self, start: float, period: float = 0.5):
        super().__init__(daemon=True)
        self.start_time, self.period, self.samples, self.stop = start, period, [], threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                out = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu,memory.used",
                                      "--format=csv,noheader,nounits", "--id=0"],
                                     capture_output=True, text=True, timeout=5, check=False).stdout.strip()
                util, mem = (float(x) for x in out.split(","))
                self.samples.append((time.monotonic() - self.start_time, util, mem))
            except (OSError, ValueError, subprocess.SubprocessError):
                pass
            self.stop.wait(self.period)

    def window(self, t0: float, t1: float) -> dict:
        inside = [s for s in self.samples if t0 <= s[0] <= t1]
        if not inside:
            return {"gpu_busy_share": None, "gpu_peak_mib": None}
        return {"gpu_busy_share": round(sum(s[1] > 0 for s in inside) / len(inside), 3),
                "gpu_mean_util": round(sum(s[1] for s in inside) / len(inside), 1),
                "gpu_peak_mib": max(s[2] for s in inside)}


def run_snakemake(cores: int, deadline: float | None, log_path: Path, sampler: GpuSampler,
                  until: str | None = None) -> tuple[int, list]:
    command = [sys.executable, "-m", "snakemake", "--cores", str(cores),
               *(["--until", until] if until else []), "--", TARGET]
    jobs, current = {}, None
    t_start = sampler.start_time
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
        timer = None
        if deadline:
            timer = threading.Timer(deadline, lambda: os.killpg(proc.pid, signal.SIGTERM))
            timer.start()
        for line in proc.stdout:
            now = time.monotonic() - t_start
            log.write(line)
            log.flush()
            if m := re.match(r"\s*(?:local)?rule (\w+):", line):
                current = {"rule": m.group(1), "start_s": now}
            elif (m := re.match(r"\s*jobid: (\d+)", line)) and current is not None:
                jobs[m.group(1)] = current
                current = None
            elif (m := re.search(r"wildcards: (.*)", line)) and jobs:
                latest = max(jobs.values(), key=lambda j: j["start_s"])
                latest.setdefault("wildcards", m.group(1).strip())
            elif (m := re.search(r"Finished job(?:id)?:? (\d+)", line)) and m.group(1) in jobs:
                jobs[m.group(1)]["end_s"] = now
        code = proc.wait()
        if timer:
            timer.cancel()
    out = []
    for job in sorted(jobs.values(), key=lambda j: j["start_s"]):
        end = job.get("end_s")
        job["wall_s"] = round(end - job["start_s"], 1) if end is not None else None
        job.update(sampler.window(job["start_s"], end if end is not None else float("inf")))
        job["start_s"] = round(job["start_s"], 1)
        if end is not None:
            job["end_s"] = round(end, 1)
        out.append(job)
    return code, out


def read_tsv(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f, delimiter="\t"))


def learning_figures() -> dict:
    figures: dict = {}
    sft = REPO / "metrics/sft/debug/summary.json"
    if sft.is_file():
        s = json.loads(sft.read_text())
        figures["sft"] = {k: s.get(k) for k in ("steps", "examples", "loss_first", "loss_final", "train_time_s",
                                                 "tokens_per_s")}
    for stage in ("rl_infill", "rl_e2e"):
        path = REPO / f"metrics/{stage}/debug/summary.json"
        if not path.is_file():
            continue
        s = json.loads(path.read_text())
        steps = read_tsv(REPO / f"metrics/{stage}/debug/steps.tsv")
        figures[stage] = {
            **{k: s.get(k) for k in ("updates_total", "groups_kept_total", "val_tasks", "val_reward_before",
                                     "best_val_reward", "best_step")},
            "mean_reward_by_step": [float(r["mean_reward"]) for r in steps],
            "compiled_by_step": [float(r["compiled"]) for r in steps],
        }
    table = REPO / TARGET
    if table.is_file():
        with open(table) as f:
            figures["evaluation"] = list(csv.DictReader(f))
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", required=True)
    parser.add_argument("--log", default=None, help="Snakemake's output (default: <out>.log)")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--cold", action="store_true")
    group.add_argument("--warm", action="store_true")
    parser.add_argument("--deadline", type=float, default=None)
    parser.add_argument("--until", default=None, metavar="RULE",
                        help="stop after this rule's jobs (Snakemake --until), e.g. rl_infill: a stage "
                             "boundary, where --deadline may stop a stage mid-way and lose its unsaved work")
    args = parser.parse_args()

    if args.cold or args.warm:
        remove(OUTPUTS + RESUME_STORES + ([".cache/dicepipe"] if args.cold else []))
    start = time.monotonic()
    sampler = GpuSampler(start)
    sampler.start()
    out = Path(args.out)
    code, jobs = run_snakemake(args.cores, args.deadline, Path(args.log or str(out) + ".log"), sampler,
                               until=args.until)
    wall = time.monotonic() - start
    sampler.stop.set()
    try:
        import torch

        card = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    except ImportError:
        card = "unknown"
    record = {
        "command": "python bench/debug_scale.py " + " ".join(sys.argv[1:]),
        "mode": "cold" if args.cold else "warm" if args.warm else "as found",
        "card": card, "cores": args.cores, "snakemake_exit": code, "wall_s": round(wall, 1),
        "gpu_peak_mib": max((s[2] for s in sampler.samples), default=None),
        "gpu_busy_share": sampler.window(0, wall)["gpu_busy_share"],
        "jobs": jobs, "learning": learning_figures(),
    }
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps({k: v for k, v in record.items() if k not in ("jobs", "learning")}))
    for job in jobs:
        print(f"{job['rule']:14s} {job.get('wildcards', ''):30s} {job['wall_s']} s  busy {job.get('gpu_busy_share')}  "
              f"peak {job.get('gpu_peak_mib')} MiB")
    return code


if __name__ == "__main__":
    sys.exit(main())
