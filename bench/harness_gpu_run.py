"""One device-machine session for the harness: GPU tests and the GPU benchmarks, in order,
each under its own time cap, everything written under --out as it finishes.

  1. GPU tests (pytest -m gpu tests/test_harness_gpu.py) and, alongside them, the sequential
     build-and-evaluate baseline (one build at a time: it shares 16 cores with one test build
     without slowing down, and its GPU use is a few seconds);
  2. our harness on the distinct candidates (all cores), capped: a rate even if cut short;
  3. noise: synthetic unchanged / 5%-faster pairs, then KernelBench level 1 against itself.

    PYTHONUNBUFFERED=1 python3 bench/harness_gpu_run.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))


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
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--sequential", type=int, default=2)
    parser.add_argument("--ours-cap", type=float, default=140)
    parser.add_argument("--noise-jobs", type=int, default=300)
    parser.add_argument("--kb-limit", type=int, default=100)
    parser.add_argument("--noise-budget", type=float, default=40,
                        help="no new chunk of noise jobs after this many seconds")
    parser.add_argument("--kb-budget", type=float, default=25)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="harness_gpu_run_"))  # logs and halves; $OUT gets few files
    env = dict(os.environ, PYTHONPATH=str(ROOT / "workflow"), PYTHONUNBUFFERED="1")
    py = sys.executable
    subprocess.run(["nvidia-smi", "--query-gpu=name,compute_cap,clocks.sm,clocks.mem",
                    "--format=csv"], check=False)

    t0 = time.monotonic()
    tests = start([py, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-m", "gpu",
                   "tests/test_harness_gpu.py"], work / "gpu_tests.log", env)
    seq = start([py, "bench/harness_throughput.py", "--backend", "cuda", "--n", str(args.n),
                 "--skip-ours", "--sequential", str(args.sequential), "--cap-s", "150",
                 "--out", str(work / "sequential.json")], work / "sequential.log", env)
    finish(seq, 170, t0, "sequential")
    finish(tests, 170, t0, "gpu tests")
    print((work / "gpu_tests.log").read_text()[-1500:], flush=True)

    t1 = time.monotonic()
    ours = start([py, "bench/harness_throughput.py", "--backend", "cuda", "--n", str(args.n),
                  "--sequential", "0", "--cap-s", str(args.ours_cap), "--out",
                  str(work / "ours.json")], work / "ours.log", env)
    finish(ours, args.ours_cap + 30, t1, "ours")
    combine_throughput(work, out, args.n)

    t2 = time.monotonic()
    noise = start([py, "bench/harness_noise.py", "--backend", "cuda", "--jobs",
                   str(args.noise_jobs), "--numel", str(2**23), "--chunk", "100", "--budget-s",
                   str(args.noise_budget), "--out", str(out / "noise_synthetic.json")],
                  work / "noise.log", env)
    finish(noise, args.noise_budget + 50, t2, "noise synthetic")
    t3 = time.monotonic()
    kb = start([py, "bench/harness_noise.py", "--backend", "cuda", "--skip-synthetic",
                "--kernelbench", ".devdata/kb_level1.parquet", "--level", "1", "--limit",
                str(args.kb_limit), "--repeats", "1", "--chunk", "20", "--budget-s",
                str(args.kb_budget), "--out", str(out / "noise_kb.json")],
               work / "noise_kb.log", env)
    finish(kb, args.kb_budget + 45, t3, "noise kernelbench")
    print(f"total {time.monotonic() - t0:.0f} s", flush=True)
    with open(out / "logs.txt", "w") as fh:
        for log in sorted(work.glob("*.log")):
            fh.write(f"===== {log.name}\n{log.read_text()[-20000:]}\n")


def combine_throughput(work: Path, out: Path, n: int) -> None:
    from harness_throughput import combine, make_pairs

    def load(name):
        try:
            return json.loads((work / name).read_text())
        except (OSError, ValueError):
            return None

    ours, seq = load("ours.json"), load("sequential.json")
    report = combine(ours and ours.get("ours"), seq and seq.get("sequential"),
                     make_pairs(n, "cuda"))
    (out / "throughput.json").write_text(json.dumps(report, indent=1))
    print(json.dumps({k: v for k, v in report.items() if k not in ("ours", "sequential")}),
          flush=True)


if __name__ == "__main__":
    main()
