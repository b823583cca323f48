"""Harness benchmark: evaluation throughput on distinct candidates vs a sequential loop.

Generates N distinct KernelBench-style pairs: reference `x * a + b` with constants of its own,
candidate a `load_inline` extension computing it (its source includes <torch/extension.h>, as
KernelBench solutions do), every tenth one wrong on purpose. Then:
  ours        `evaluate` on all N with a cold build cache, builds in parallel ahead of the
              device work (journal polled, so a time cap still gives a rate);
  sequential  the loop KernelBench's scripts run without a build cache: per candidate a
              fresh process builds it with load_inline (local GPU architecture only), checks
              5 trials and times 100 calls; run on the first K candidates (one wrong among
              them), whose verdicts are compared with ours.

    python harness/bench/harness_throughput.py --backend cuda --n 100 --sequential 2 --out t.json
    python harness/bench/harness_throughput.py --combine OURS.json SEQUENTIAL.json --out t.json

Each half also reports the CPU seconds it spent (every process it started, compilers
included), so the cost per build can be compared as well as the wall-clock rate.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REFERENCE = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return x * {a} + {b}

def get_inputs():
    return [torch.rand({shape})]

def get_init_inputs():
    return []
'''

CUDA_CANDIDATE = r'''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

affine_source = """
#include <torch/extension.h>
#include <cuda_runtime.h>

__global__ void affine_{i}_kernel(const float* x, float* y, int64_t n) {{
    int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (idx < n) y[idx] = x[idx] * {a}f + {b}f;
}}

torch::Tensor affine_{i}_cuda(torch::Tensor x) {{
    auto y = torch::empty_like(x);
    int64_t n = x.numel();
    const int threads = 256;
    const int blocks = (int)((n + threads - 1) / threads);
    affine_{i}_kernel<<<blocks, threads>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}}
"""

affine_cpp = "torch::Tensor affine_{i}_cuda(torch::Tensor x);"

affine = load_inline(name="affine_{i}", cpp_sources=affine_cpp, cuda_sources=affine_source,
                     functions=["affine_{i}_cuda"], verbose=False, extra_cflags=["-O3"],
                     extra_cuda_cflags=["-O3"])

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return affine.affine_{i}_cuda(x)
'''

CPU_CANDIDATE = r'''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

affine_source = """
torch::Tensor affine_{i}(torch::Tensor x) {{
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const float* src = xc.data_ptr<float>();
    float* dst = y.data_ptr<float>();
    const int64_t n = xc.numel();
#pragma omp parallel for
    for (int64_t k = 0; k < n; ++k) dst[k] = src[k] * {a}f + {b}f;
    return y;
}}
"""

affine = load_inline(name="affine_{i}", cpp_sources=[affine_source], functions=["affine_{i}"],
                     extra_cflags=["-O3", "-fopenmp"], extra_ldflags=["-fopenmp"])

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return affine.affine_{i}(x)
'''


def make_pairs(n: int, backend: str) -> list[dict]:
    pairs = []
    shape = "4096, 4096" if backend == "cuda" else "512, 1024"
    template = CUDA_CANDIDATE if backend == "cuda" else CPU_CANDIDATE
    for i in range(n):
        a, b = 1.0 + (i + 1) / 1024.0, (i + 1) / 64.0
        wrong = i % 10 == 3
        ref = REFERENCE.format(a=repr(a), b=repr(b), shape=shape)
        cand = template.format(i=i, a=repr(a), b=repr(b + 0.5 if wrong else b))
        pairs.append({"job_id": f"affine_{i:03d}", "reference": ref, "candidate": cand,
                      "intended_correct": not wrong})
    return pairs


def children_cpu_s() -> float:
    """CPU seconds of every finished child process (and theirs, once reaped)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_ours(args, pairs: list[dict], workdir: Path) -> dict:
    """Our harness in a child process, its journal polled for a rate even under a cap."""
    (workdir / "pairs.json").write_text(json.dumps(pairs))
    results = workdir / "ours.parquet"
    journal = workdir / "ours.parquet.journal.jsonl"
    cmd = [sys.executable, __file__, "--child-ours", str(workdir), "--backend", args.backend,
           "--build-workers", str(args.build_workers)]
    start, cpu0 = time.monotonic(), children_cpu_s()
    proc = subprocess.Popen(cmd)
    progress = []
    while proc.poll() is None and time.monotonic() - start < args.cap_s:
        time.sleep(1.0)
        done = journal.read_text().count("\n") if journal.is_file() else 0
        progress.append((round(time.monotonic() - start, 1), done))
    capped = proc.poll() is None
    if capped:
        proc.kill()
        proc.wait()
    wall = time.monotonic() - start
    cpu = children_cpu_s() - cpu0
    rows = []
    if results.is_file() and not capped:
        import pyarrow.parquet as pq

        rows = pq.read_table(results).to_pylist()
    elif journal.is_file():
        rows = [json.loads(line) for line in journal.read_text().splitlines() if line.strip()]
    return {"wall_s": round(wall, 1), "done": len(rows), "capped": capped,
            "kernels_per_min": round(len(rows) / wall * 60, 2),
            "cpu_s_per_kernel": round(cpu / len(rows), 1) if rows and not capped else None,
            "build_s": sorted(round(r["wall_build_s"] or 0.0, 1) for r in rows)[:: max(1, len(rows) // 10)],
            "progress": progress[:: max(1, len(progress) // 40)],
            "verdicts": {r["job_id"]: bool(r["correct"]) for r in rows},
            "errors": {r["job_id"]: (r["error"] or "")[-300:] for r in rows
                       if r["error"] and r["compiled"] is False}}


def child_ours(workdir: Path, backend: str, build_workers: int) -> None:
    from kernelharness import HarnessSettings, Job, evaluate

    pairs = json.loads((workdir / "pairs.json").read_text())
    jobs = [Job(p["job_id"], p["reference"], p["candidate"], backend) for p in pairs]
    settings = HarnessSettings.with_defaults(cache_dir=str(workdir / "cache"),
                                             build_workers=build_workers)
    evaluate(jobs, settings, results_path=workdir / "ours.parquet", progress=False)


SEQUENTIAL_ONE = r'''
import json, os, sys, tempfile, time
os.environ["TORCH_EXTENSIONS_DIR"] = tempfile.mkdtemp(prefix="kb_seq_")
import torch
ref_code, cand_code, device = sys.argv[1], sys.argv[2], sys.argv[3]
out = {"compiled": False, "correct": False}
ref_ns, cand_ns = {}, {}
exec(compile(ref_code, "reference.py", "exec"), ref_ns)
try:
    exec(compile(cand_code, "candidate.py", "exec"), cand_ns)
    out["compiled"] = True
    torch.manual_seed(42)
    init = ref_ns["get_init_inputs"]()
    torch.manual_seed(42)
    model = ref_ns["Model"](*init).to(device)
    torch.manual_seed(42)
    new = cand_ns["ModelNew"](*init).to(device)
    ok = True
    with torch.no_grad():
        for trial in range(5):
            torch.manual_seed(1000 + trial)
            inputs = [x.to(device) for x in ref_ns["get_inputs"]()]
            if not torch.allclose(model(*inputs), new(*inputs), atol=1e-4, rtol=1e-4):
                ok = False
                break
        out["correct"] = ok
        if ok:
            inputs = [x.to(device) for x in ref_ns["get_inputs"]()]
            times = []
            for fn in (model, new):
                for _ in range(3):
                    fn(*inputs)
                for _ in range(100):
                    if device == "cuda":
                        s = torch.cuda.Event(enable_timing=True)
                        e = torch.cuda.Event(enable_timing=True)
                        s.record(); fn(*inputs); e.record(); torch.cuda.synchronize()
                        times.append(s.elapsed_time(e))
                    else:
                        t0 = time.perf_counter(); fn(*inputs)
                        times.append((time.perf_counter() - t0) * 1e3)
            out["speedup"] = (sum(times[:100]) / 100) / (sum(times[100:]) / 100)
except Exception as exc:
    out["error"] = repr(exc)[-300:]
print("RESULT " + json.dumps(out))
'''


def run_sequential(args, pairs: list[dict]) -> dict:
    env = dict(os.environ)
    if args.backend == "cuda":
        from kernelharness.compilation.buildspec import local_cuda_arch

        env.setdefault("TORCH_CUDA_ARCH_LIST", local_cuda_arch() or "9.0")
    wrong = [p for p in pairs if not p["intended_correct"]][:1]
    right = [p for p in pairs if p["intended_correct"]]
    chosen = (wrong + right)[: args.sequential] if args.sequential > 1 else right[:1]
    start, cpu0 = time.monotonic(), children_cpu_s()
    verdicts, per_kernel = {}, []
    for pair in chosen:
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-c", SEQUENTIAL_ONE, pair["reference"],
                               pair["candidate"], args.backend], capture_output=True, text=True,
                              env=env, timeout=args.cap_s)
        line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
        result = json.loads(line[7:]) if line else {"compiled": False, "correct": False,
                                                     "error": proc.stderr[-300:]}
        verdicts[pair["job_id"]] = bool(result["correct"])
        per_kernel.append(round(time.monotonic() - t0, 1))
    wall = time.monotonic() - start
    cpu = children_cpu_s() - cpu0
    return {"wall_s": round(wall, 1), "done": len(chosen), "seconds_per_kernel": per_kernel,
            "cpu_s_per_kernel": round(cpu / max(1, len(chosen)), 1),
            "kernels_per_min": round(len(chosen) / wall * 60, 3), "verdicts": verdicts}


def combine(ours: dict | None, seq: dict | None, pairs: list[dict]) -> dict:
    """Throughput ratio and verdict agreement from the two halves (run apart or together)."""
    report: dict = {"ours": ours, "sequential": seq}
    if ours and seq:
        report["ratio"] = round(ours["kernels_per_min"] / seq["kernels_per_min"], 2)
        shared = [k for k in seq["verdicts"] if k in ours["verdicts"]]
        report["verdicts_compared"] = len(shared)
        report["verdicts_identical"] = all(seq["verdicts"][k] == ours["verdicts"][k]
                                           for k in shared)
        intended = {p["job_id"]: p["intended_correct"] for p in pairs}
        report["side_by_side"] = {k: {"sequential": seq["verdicts"][k],
                                      "ours": ours["verdicts"][k], "intended": intended[k]}
                                  for k in shared}
    # every pair's right verdict is known by construction: both loops are held to it too,
    # which compares them even when a capped run left no kernel measured by both
    intended = {p["job_id"]: p["intended_correct"] for p in pairs}
    for name, part in (("ours", ours), ("sequential", seq)):
        if part:
            matching = sum(v == intended[k] for k, v in part["verdicts"].items())
            report[f"{name}_match_intent"] = f"{matching}/{len(part['verdicts'])}"
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["cpu", "cuda"], default="cuda")
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--sequential", type=int, default=2, help="0: skip the sequential loop")
    parser.add_argument("--skip-ours", action="store_true", help="only the sequential loop")
    parser.add_argument("--build-workers", type=int, default=0)
    parser.add_argument("--cap-s", type=float, default=600.0)
    parser.add_argument("--out", default=None)
    parser.add_argument("--combine", nargs=2, metavar=("OURS", "SEQUENTIAL"), default=None,
                        help="combine two reports written by separate runs")
    parser.add_argument("--child-ours", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_ours:
        child_ours(Path(args.child_ours), args.backend, args.build_workers)
        return
    if args.combine:
        halves = [json.loads(Path(p).read_text()) for p in args.combine]
        report = {**{k: v for k, v in halves[0].items() if k not in ("ours", "sequential")},
                  **combine(halves[0]["ours"], halves[1]["sequential"],
                            make_pairs(halves[0]["n"], halves[0]["backend"]))}
        print(json.dumps({k: v for k, v in report.items() if k not in ("ours", "sequential")}))
        if args.out:
            Path(args.out).write_text(json.dumps(report, indent=1))
        return
    pairs = make_pairs(args.n, args.backend)
    workdir = Path(tempfile.mkdtemp(prefix="harness_throughput_"))
    ours = seq = None
    try:
        if not args.skip_ours:
            ours = run_ours(args, pairs, workdir)
            print(json.dumps({k: v for k, v in ours.items() if k not in ("verdicts", "progress")}),
                  flush=True)
        if args.sequential > 0:
            seq = run_sequential(args, pairs)
            print(json.dumps(seq), flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    report = {"backend": args.backend, "machine": platform.node(), "cores": os.cpu_count(),
              "command": " ".join(sys.argv), "n": args.n, **combine(ours, seq, pairs)}
    print(json.dumps({k: v for k, v in report.items() if k not in ("ours", "sequential")}),
          flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
