"""Device-machine sessions for the harness: GPU tests and GPU benchmarks, chosen by --parts,
each under its own time cap, results written under --out as they finish.

Parts, in the order they run:
  tests  pytest -m gpu harness/tests/test_gpu.py, alongside
  seq    the sequential build-and-evaluate baseline on --sequential kernels of the 100 (one
         build at a time: it shares 16 cores with one test build without slowing down, and
         its GPU use is a few seconds, over before the noise parts start);
  noise  synthetic unchanged / 5.3%-faster pairs under the repeat rule (up to --repeats);
  kb     KernelBench level 1 problems against themselves (up to --repeats);
  ours   our harness on the --n distinct candidates, cold cache, all cores (alone: it is the
         throughput being measured).

    PYTHONUNBUFFERED=1 python3 harness/bench/harness_gpu_run.py --out $OUT --parts tests,seq,noise,kb
    PYTHONUNBUFFERED=1 python3 harness/bench/harness_gpu_run.py --out $OUT --parts ours
    python harness/bench/harness_throughput.py --combine OUT/ours.json OUT/sequential.json
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository (commands run from there)


def start(cmd: list[str], log: Path, env: dict) -> subprocess.Popen:
    print("$", " ".join(cmd), flush=True)
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=open(log, "w"),
                            stderr=subprocess.STDOUT)


def finish(proc: subprocess.Popen, cap_s: float, began: float, name: str) -> None:
    try:
        proc.wait(timeout=max(1.0, cap_s - (time.monotonic() - began)))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        print(f"{name}: stopped at its cap of {cap_s:.0f} s", flush=True)
    print(f"{name}: exit {proc.returncode} after {time.monotonic() - began:.0f} s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--parts", default="tests,seq,noise,kb")
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--sequential", type=int, default=2)
    parser.add_argument("--seq-cap", type=float, default=200)
    parser.add_argument("--ours-cap", type=float, default=520)
    parser.add_argument("--repeats", type=int, default=5, help="params.yaml verify.repeats")
    parser.add_argument("--noise-jobs", type=int, default=300)
    parser.add_argument("--noise-budget", type=float, default=40,
                        help="no new chunk of noise jobs after this many seconds")
    parser.add_argument("--kb-every", type=int, default=5)
    parser.add_argument("--kb-limit", type=int, default=20)
    parser.add_argument("--kb-budget", type=float, default=70)
    parser.add_argument("--kb-trials", type=int, default=50)
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="harness_gpu_run_"))  # logs; $OUT gets few files
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    py = sys.executable
    subprocess.run(["nvidia-smi", "--query-gpu=name,compute_cap,clocks.sm,clocks.mem",
                    "--format=csv"], check=False)
    t0 = time.monotonic()
    running = []
    if "tests" in parts:
        running.append(("gpu tests", start(
            [py, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-m", "gpu",
             "harness/tests/test_gpu.py"], work / "gpu_tests.log", env), args.seq_cap))
    if "seq" in parts:
        running.append(("sequential", start(
            [py, "harness/bench/harness_throughput.py", "--backend", "cuda", "--n", str(args.n),
             "--skip-ours", "--sequential", str(args.sequential), "--cap-s",
             str(args.seq_cap), "--out", str(out / "sequential.json")],
            work / "sequential.log", env), args.seq_cap + 20))
    if "ours" in parts:  # beside the GPU tests when both are asked for: ~1% of its CPU time
        t1 = time.monotonic()
        ours = start([py, "harness/bench/harness_throughput.py", "--backend", "cuda", "--n",
                      str(args.n), "--sequential", "0", "--cap-s", str(args.ours_cap),
                      "--out", str(out / "ours.json")], work / "ours.log", env)
    for name, proc, cap in running:
        finish(proc, cap, t0, name)
    if "tests" in parts:
        print((work / "gpu_tests.log").read_text()[-1500:], flush=True)
    if "ours" in parts:
        finish(ours, args.ours_cap + 30, t1, "ours")
        print((work / "ours.log").read_text()[-1500:], flush=True)
    if "noise" in parts:
        t2 = time.monotonic()
        finish(start([py, "harness/bench/harness_noise.py", "--backend", "cuda", "--jobs",
                      str(args.noise_jobs), "--numel", str(2**23), "--chunk", "60",
                      "--synthetic-repeats", str(args.repeats), "--budget-s",
                      str(args.noise_budget), "--out", str(out / "noise_synthetic.json")],
                     work / "noise.log", env), args.noise_budget + 45, t2, "noise synthetic")
    if "kb" in parts:
        t3 = time.monotonic()
        finish(start([py, "harness/bench/harness_noise.py", "--backend", "cuda", "--skip-synthetic",
                      "--kernelbench", ".devdata/kb_level1.parquet", "--level", "1",
                      "--every", str(args.kb_every), "--limit", str(args.kb_limit),
                      "--repeats", str(args.repeats), "--timing-trials", str(args.kb_trials),
                      "--chunk", "5", "--budget-s", str(args.kb_budget),
                      "--out", str(out / "noise_kb.json")], work / "noise_kb.log", env),
               args.kb_budget + 60, t3, "noise kernelbench")
    print(f"total {time.monotonic() - t0:.0f} s", flush=True)
    with open(out / "logs.txt", "w") as fh:
        for log in sorted(work.glob("*.log")):
            fh.write(f"===== {log.name}\n{log.read_text()[-20000:]}\n")


if __name__ == "__main__":
    main()
