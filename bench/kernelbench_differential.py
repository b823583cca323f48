"""Differential test against KernelBench's own code (bench/README.md "KernelBench's own check
beside ours"): the same kernel pairs judged by KernelBench 423217d's `eval_kernel_against_ref`
and by the harness's `kernelbench` and `kernelbench_v0` protocols; (compiled, correct) must
agree on every pair but the listed ones.

    PYTHONUNBUFFERED=1 PYTHONPATH=workflow python3 bench/kernelbench_differential.py \
        --parquet .carry/shared/data/kernelbench/kernelbench_levels_1-3.parquet \
        --kernelbench .carry/shared/reference/KernelBench-423217d \
        --out $OUT/kbdiff --state .cache/kbdiff --rerun-disagreements 2 --budget-s 480

Pairs (`--sources`): `copies` (the `--levels` problems, ModelNew a copy of Model: the folder
baseline's files), `adversarial` (KernelBench's unit_tests/test_kernels/, each against level 1
problem 1 as its test_eval_adversarial.py runs them), `templates` (augment's CUDA template
author, two shapes per family as bench/augment_cuda.py picks them: real kernels with real
rounding), `corpus` (with `--corpus DIR`, the real corpus of bench/harness_real_corpus.py;
long: its builds alone took minutes there).

KernelBench's side: one fresh process per pair (bench/kernelbench_eval_child.py), `--kb-jobs`
at a time within `--kb-host-gb` of input sets, `eval_kernel_against_ref(seed_num=42,
num_correct_trials=5, measure_performance=False, precision=fp32)` with
`get_tolerance_for_precision` patched to 1e-4 (its fp32 tolerance) and 1e-2 (v0's): by
default one run at 1e-4 whose allclose calls are re-evaluated at 1e-2 (`--kb-mode probe`:
same outputs, half the input draws), or one run per tolerance (`--kb-mode separate`); the
two give the same verdicts (tests/test_kernelbench_oracle.py). Recorded as its batch script
records a run (a timeout or an escaped exception: compiled=False). Pairs whose candidates
build the same extension share a build folder and run after the first of them.
The harness's side: one HarnessSession (`--harness-workers` device workers on GPU 0),
correctness only, params.yaml's harness settings, in chunks. Both sides run at the same time
(`--sequential`: KernelBench's first) and journal under `--state`: a cut run resumes.

GPU memory: level 1's inputs and outputs run to several GB per problem, and KernelBench's
`--kb-jobs` children and our `--harness-workers` share the one GPU: run concurrently they run
out of GPU memory (29 of 31 differences of a concurrent level-1 run were a side's CUDA OOM:
docs/journal/2026-12-03-kernelbench-differential-l1.md). For level 1 use `--sequential
--kb-jobs 2 --harness-workers 1`; re-runs of disagreements go `--rerun-jobs` (1) at a time,
KernelBench's first, and an OOM on either side is named in the reason. The clean level-1 run
measured why: at `--kb-jobs 4` KernelBench's children hold 42-50 GB each on the big level-1
problems (10 of 100 copies still hit CUDA OOM), and our workers read memory for the whole
device, so several on one GPU count each other's allocations as a leak and are replaced after
most jobs (3 workers: 36 pairs in 7 minutes; one worker alone does a level-1 copy in 1-2 s).
The pipeline itself runs one worker per GPU.

Cost: host-side input draws dominate. Both KernelBench and the harness's KernelBench trials
draw `get_inputs()` on the CPU (serial: ~4 ns an element on the 2-core VM), and one draw of
every level 1 problem is 317 GiB (levels 2 and 3: 29 GiB). So split a long run: first
`--levels 2 3` (with the adversarial kernels and templates), then the full command (level 1
new, the rest resumed from the journals), each call under `--budget-s`.

Writes to --out: pairs.csv (every pair: both sides, the verdicts, agreement, reason),
disagreements.md (the table for bench/README.md: pair, KernelBench's and our (compiled,
correct), our trials' needed tolerances, the reason), summary.json. A disagreement's reason
is suggested from facts (`diagnose`: integer inputs, which KernelBench casts to fp32; a
reference that draws random numbers, whose RNG state KernelBench hands on to the candidate;
a needed tolerance at the boundary; `--rerun-disagreements N`: verdicts that change between
runs, or "reproduced"); otherwise "unexplained (both sides' errors)": read those.

Test without CUDA: `--backend cpu --kb-emulate-cpu --sources copies --tasks L1/95_CrossEntropyLoss`
(KernelBench's CUDA calls made no-ops) or `--skip-kernelbench`.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHILD = Path(__file__).resolve().parent / "kernelbench_eval_child.py"
PROTOCOLS = {"kernelbench": 1e-4, "kernelbench_v0": 1e-2}  # ours -> KernelBench's tolerance
ADVERSARIAL = {  # KernelBench's test_eval_adversarial.py: the kernel, the problem, its claim
    "result_reuse_kernel.py": "incorrect",
    "zero_out_kernel.py": "incorrect",
    "non_default_stream_kernel.py": "correct",  # only its timing is meant to be flagged
}
ADVERSARIAL_PROBLEM = "L1/1_Square_matrix_multiplication_"


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def safe(pair_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", pair_id)


# ---------------------------------------------------------------- pairs

def gather_pairs(args) -> list[dict]:
    from dicepipe.data.benchmark import load_benchmark, reference_copy

    tasks = load_benchmark({"kind": "parquet", "path": str(args.parquet), "levels": [1, 2, 3],
                            "version": "423217d"}).to_pylist()
    by_id = {t["task_id"]: t for t in tasks}
    pairs = []

    def add(pair_id, source, reference, candidate, expected="", task=None):
        pairs.append({"pair_id": pair_id, "source": source, "expected": expected,
                      "level": (task or {}).get("level"), "problem": (task or {}).get("name"),
                      "reference_code": reference, "candidate_code": candidate})

    if "copies" in args.sources:
        for level in args.levels:
            chosen = [t for t in tasks if t["level"] == level
                      and (not args.tasks or t["task_id"] in args.tasks)]
            for task in chosen[: args.limit] if args.limit else chosen:
                add(f"copy/{task['task_id']}", "copies", task["reference_code"],
                    reference_copy(task["reference_code"]), "correct", task)
    if "adversarial" in args.sources:
        folder = args.kernelbench / "src" / "kernelbench" / "unit_tests" / "test_kernels"
        task = by_id.get(ADVERSARIAL_PROBLEM)
        if task is None:
            sys.exit(f"--sources adversarial needs {ADVERSARIAL_PROBLEM} (level 1) in the parquet")
        for name, expected in ADVERSARIAL.items():
            add(f"adversarial/{Path(name).stem}", "adversarial", task["reference_code"],
                (folder / name).read_text(), expected, task)
    if "templates" in args.sources:
        import yaml

        sys.path.insert(0, str(ROOT / "bench"))
        from augment_cuda import two_shapes_per_family
        from dicepipe.augment.authors.templates import TemplateAuthor

        settings = dict(yaml.safe_load(args.params.read_text())["augment"], author="templates")
        author = TemplateAuthor()
        for task in two_shapes_per_family(settings):
            add(f"template/{task.task_id}", "templates", task.reference_code,
                author.write(task, 0).code)
    if "corpus" in args.sources:
        if args.corpus is None:
            sys.exit("--sources corpus needs --corpus DIR (candidates/, references/, manifest.jsonl)")
        manifest = {}
        if (args.corpus / "manifest.jsonl").is_file():
            manifest = {e["key"]: e for e in map(json.loads,
                        (args.corpus / "manifest.jsonl").read_text().splitlines()) if e}
        for cand in sorted((args.corpus / "candidates").glob("*.py")):
            meta = manifest.get(cand.stem, {})
            ref = args.corpus / "references" / cand.name
            add(f"corpus/{cand.stem}", "corpus", ref.read_text(), cand.read_text(),
                {"correct": "correct", "incorrect": "incorrect"}.get(meta.get("expected"), ""),
                {"level": meta.get("level"), "name": meta.get("problem_name")})
    sizes: dict[str, int] = {}
    for pair in pairs:
        pair["key"] = sha(pair["reference_code"] + "\0" + pair["candidate_code"])
        pair["build_group"] = build_group(pair["candidate_code"], pair["key"])
        ref = sha(pair["reference_code"])
        if ref not in sizes:
            sizes[ref] = input_bytes(pair["reference_code"])
        # the drawn set, with room for the outputs and the process itself
        pair["host_bytes"] = 2 * sizes[ref] + 2**30
    return pairs


def input_bytes(reference_code: str) -> int:
    """Bytes of one `get_inputs()` set, drawn on torch's meta device (nothing allocated);
    1 GiB when the file cannot say."""
    import torch

    context: dict = {}
    try:
        with torch.device("meta"):
            exec(compile(reference_code, "reference", "exec"), context)  # noqa: S102 - task file
            inputs = context["get_inputs"]()
        return sum(x.numel() * x.element_size() for x in inputs if isinstance(x, torch.Tensor))
    except Exception:  # noqa: BLE001 - an estimate for scheduling only
        return 2**30


def build_group(candidate: str, key: str) -> str | None:
    """Pairs whose candidates build the same extension (same load_inline names and the same
    long source strings) share a build folder; None: nothing to build."""
    if "load_inline" not in candidate and "cpp_extension" not in candidate:
        return None
    import ast

    try:
        tree = ast.parse(candidate)
    except SyntaxError:
        return key
    strings = sorted(node.value for node in ast.walk(tree)
                     if isinstance(node, ast.Constant) and isinstance(node.value, str)
                     and len(node.value) > 200)
    names = sorted(re.findall(r"name\s*=\s*['\"]([^'\"]+)['\"]", candidate))
    return sha("\0".join(names + strings)) if strings else key


def write_files(pairs: list[dict], state: Path) -> None:
    for pair in pairs:
        folder = state / "files" / safe(pair["pair_id"])
        folder.mkdir(parents=True, exist_ok=True)
        for name, code in (("reference.py", pair["reference_code"]),
                           ("candidate.py", pair["candidate_code"])):
            path = folder / name
            if not path.is_file() or path.read_text() != code:
                path.write_text(code)
        pair["folder"] = str(folder)


# ---------------------------------------------------------------- KernelBench's side

class Journal:
    """Append-only JSON lines, one per finished unit of work, read back on resume."""

    def __init__(self, path: Path):
        self.path = path
        self.lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)

    def read(self) -> list[dict]:
        if not self.path.is_file():
            return []
        out = []
        for line in self.path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut by a kill
                continue
        return out

    def append(self, entry: dict) -> None:
        with self.lock, open(self.path, "a") as fh:
            fh.write(json.dumps(entry, sort_keys=True, default=str) + "\n")


LIVE_CHILDREN: set = set()  # process groups to kill if this script is stopped
STOPPING = threading.Event()  # set when stopped: a child killed then is no result to journal


def kill_children(*_signal) -> None:
    STOPPING.set()
    for pid in list(LIVE_CHILDREN):
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
    if _signal:
        raise SystemExit(128 + _signal[0])  # unwinds the harness session: its workers stop


def run_child(spec: dict, timeout_s: float, env: dict, log_path: Path) -> tuple[dict | None, str]:
    """Run one child; (its JSON output, 'ok' | 'timeout' | 'crashed:<rc>')."""
    spec_path = Path(spec["out"]).with_suffix(".spec.json")
    spec_path.write_text(json.dumps(spec))
    Path(spec["out"]).unlink(missing_ok=True)
    with open(log_path, "ab") as log_fh:
        proc = subprocess.Popen([sys.executable, str(CHILD), str(spec_path)], stdout=log_fh,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)
        LIVE_CHILDREN.add(proc.pid)
        try:
            rc = proc.wait(timeout=timeout_s)
            status = "ok" if rc == 0 else f"crashed:{rc}"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            status = "timeout"
        finally:
            LIVE_CHILDREN.discard(proc.pid)
    out = Path(spec["out"])
    return (json.loads(out.read_text()) if out.is_file() else None), status


class KernelBenchSide:
    """KernelBench's verdicts for every pair at every tolerance, `run` times (0: the first)."""

    def __init__(self, args, state: Path):
        self.args = args
        self.state = state
        self.journal = Journal(state / "kernelbench.jsonl")
        self.tolerances = [float(t) for t in args.kb_tolerances]
        threads = max(1, (os.cpu_count() or 2) // max(1, args.kb_jobs))
        self.env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
                        PYTHONUNBUFFERED="1")
        if args.cuda_arch:
            self.env["TORCH_CUDA_ARCH_LIST"] = args.cuda_arch
        (state / "kb_runs").mkdir(parents=True, exist_ok=True)
        (state / "kb_logs").mkdir(parents=True, exist_ok=True)

    def done(self) -> dict:
        """(pair key, tol, run) -> the journal entry."""
        return {(e["key"], float(e["tol"]), int(e["run"])): e for e in self.journal.read()}

    def run(self, pairs: list[dict], run_index: int = 0, deadline: float | None = None) -> None:
        done = self.done()
        todo = [p for p in pairs
                if any((p["key"], t, run_index) not in done for t in self.tolerances)]
        if not todo:
            return
        groups: dict[str, list[dict]] = {}
        for pair in todo:
            groups.setdefault(pair["build_group"] or pair["key"], []).append(pair)
        # builders first (their builds overlap the copies); a group's other pairs wait for
        # its first, so they find the extension built
        ready = [g[0] for g in sorted(groups.values(), key=lambda g: g[0]["build_group"] is None)]
        followers = {g[0]["pair_id"]: g[1:] for g in groups.values() if len(g) > 1}
        remaining = [len(todo)]
        # host memory: each child holds a pair's input set on the host while it draws it
        # (up to 17 GB on level 1), so big pairs wait for room (one always runs)
        budget = self.args.kb_host_gb * 2**30
        in_use = [0]
        cond = threading.Condition()
        began = time.monotonic()

        def take():
            for i, pair in enumerate(ready):
                if in_use[0] == 0 or in_use[0] + pair["host_bytes"] <= budget:
                    in_use[0] += pair["host_bytes"]
                    return ready.pop(i)
            return None

        def worker():
            while True:
                with cond:
                    pair = take()
                    while pair is None and remaining[0] > 0:
                        cond.wait(0.5)
                        pair = take()
                    if pair is None:
                        return
                if deadline is not None and time.monotonic() > deadline:
                    with cond:  # out of budget: this pair and its group are left for a resume
                        in_use[0] -= pair["host_bytes"]
                        remaining[0] -= 1 + len(followers.pop(pair["pair_id"], []))
                        cond.notify_all()
                    continue
                wall = 0.0
                try:
                    wall = self.run_pair(pair, run_index, done)
                finally:
                    with cond:
                        in_use[0] -= pair["host_bytes"]
                        remaining[0] -= 1
                        ready.extend(followers.pop(pair["pair_id"], []))
                        cond.notify_all()
                log(f"kernelbench run {run_index}: {len(todo) - remaining[0]}/{len(todo)} "
                    f"{pair['pair_id']} ({wall:.1f} s; {time.monotonic() - began:.0f} s)")

        threads = [threading.Thread(target=worker, daemon=True) for _ in range(self.args.kb_jobs)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def run_pair(self, pair: dict, run_index: int, done: dict) -> float:
        """Every missing tolerance of one pair, in fresh children: another starts after a run
        that broke the CUDA context or KernelBench's "lock" None (at most 3 children)."""
        began = time.monotonic()
        name = f"{safe(pair['pair_id'])}__run{run_index}"
        build_dir = self.state / "kb_build" / (pair["build_group"] or "none")
        build_dir.mkdir(parents=True, exist_ok=True)
        missing = [t for t in self.tolerances if (pair["key"], t, run_index) not in done]
        for attempt in range(1, 4):
            if not missing:
                break
            timeout = self.args.kb_timeout * len(missing)
            if pair["build_group"]:
                timeout += self.args.kb_build_timeout
            spec = {"mode": "eval", "kb_src": str(self.args.kernelbench / "src"),
                    "reference_path": str(Path(pair["folder"]) / "reference.py"),
                    "candidate_path": str(Path(pair["folder"]) / "candidate.py"),
                    "tolerances": missing, "trials": self.args.trials,
                    "kb_mode": self.args.kb_mode,
                    "build_dir": str(build_dir), "emulate_cpu": self.args.kb_emulate_cpu,
                    "out": str(self.state / "kb_runs" / f"{name}.json")}
            out, status = run_child(spec, timeout, self.env,
                                    self.state / "kb_logs" / f"{name}.log")
            if STOPPING.is_set():
                return time.monotonic() - began
            for run in (out or {}).get("runs", []):
                if run["status"] == "none" and attempt < 3:
                    continue  # KernelBench's own "retry" signal
                self.record(pair, run_index, run, out, status)
                missing.remove(float(run["tol"]))
            if missing and status != "ok":
                # KernelBench's script: a timeout is compiled=False; so is a dead process
                for tol in missing:
                    self.record(pair, run_index, {
                        "tol": tol, "status": status, "compiled": False, "correctness": False,
                        "metadata": {"error": "Evaluation timed out" if status == "timeout"
                                     else f"evaluation process ended: {status}"}}, out, status)
                missing = []
        for tol in missing:
            self.record(pair, run_index, {"tol": tol, "status": "no_result", "compiled": None,
                                          "correctness": None, "metadata": {}}, None, "no_result")
        return time.monotonic() - began

    def record(self, pair: dict, run_index: int, run: dict, out: dict | None, status: str) -> None:
        self.journal.append({"key": pair["key"], "pair_id": pair["pair_id"], "run": run_index,
                             "tol": float(run["tol"]), "status": run.get("status", status),
                             "compiled": run.get("compiled"), "correctness": run.get("correctness"),
                             "metadata": run.get("metadata", {}), "wall_s": run.get("wall_s"),
                             "stubs": (out or {}).get("stubs", []),
                             "torch": (out or {}).get("torch")})

    def diagnose(self, pairs: list[dict]) -> dict:
        """pair key -> facts about its reference (integer inputs, RNG use)."""
        journal = Journal(self.state / "diagnose.jsonl")
        known = {e["key"]: e for e in journal.read()}
        for pair in pairs:
            if pair["key"] in known:
                continue
            name = f"{safe(pair['pair_id'])}__diagnose"
            spec = {"mode": "diagnose", "reference_path": str(Path(pair["folder"]) / "reference.py"),
                    "emulate_cpu": self.args.kb_emulate_cpu,
                    "out": str(self.state / "kb_runs" / f"{name}.json")}
            out, status = run_child(spec, self.args.kb_timeout, self.env,
                                    self.state / "kb_logs" / f"{name}.log")
            entry = dict(out or {"diagnose_status": status}, key=pair["key"])
            journal.append(entry)
            known[pair["key"]] = entry
        return known


# ---------------------------------------------------------------- the harness's side

def harness_settings(args):
    import yaml
    from kernelharness import HarnessSettings

    params = yaml.safe_load(args.params.read_text())  # no schema check: no jsonschema needed
    harness = params["harness"]
    values = {"measure": dict(harness["measure"], kernelbench_trials=args.trials),
              "run": dict(harness["run"])}
    if args.cache_dir:
        values["run"]["cache_dir"] = str(args.cache_dir)
    settings = HarnessSettings.from_params(values)
    if args.backend == "cuda" and args.harness_workers > 1:
        import dataclasses

        # several workers on GPU 0
        settings = dataclasses.replace(settings, devices=(0,) * args.harness_workers)
    return settings, params.get("protocols")


def run_harness(pairs: list[dict], args, state: Path, run_index: int = 0,
                deadline: float | None = None) -> dict:
    """pair key -> our result row (correctness only). Run 0 resumes from its journal; a rerun
    uses fresh job ids in a fresh session, so nothing is copied from an earlier row. Pairs
    with builds go first; with a deadline, no new chunk starts after it."""
    suffix = "" if run_index == 0 else f"@rerun{run_index}"
    results = state / "harness" / f"results_run{run_index}.parquet"
    if args.from_state or args.skip_harness:
        return saved_rows(pairs, results, suffix)
    from kernelharness import HarnessSession, Job

    settings, _ = harness_settings(args)
    ordered = sorted(pairs, key=lambda p: p["build_group"] is None)
    results.parent.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    rows: dict = {}
    chunk = args.harness_chunk or len(ordered) or 1
    with HarnessSession(settings) as session:
        for start in range(0, len(ordered), chunk):
            if deadline is not None and time.monotonic() > deadline:
                log(f"harness: budget spent after {len(rows)} of {len(ordered)} pairs")
                break
            part = ordered[start:start + chunk]
            jobs = [Job(p["pair_id"] + suffix, p["reference_code"], p["candidate_code"],
                        args.backend) for p in part]
            table = session.evaluate(jobs, results_path=results, progress=True,
                                     measure_speed=False)
            rows.update({p["key"]: row for p, row in zip(part, table.to_pylist())})
            log(f"harness run {run_index}: {len(rows)}/{len(ordered)} pairs, "
                f"{time.monotonic() - began:.0f} s ({session.last_summary.line()})")
    return rows


def saved_rows(pairs: list[dict], results: Path, suffix: str) -> dict:
    """pair key -> our row as a results file holds it (--from-state: the content keys name the
    machine's toolchain, so a session on another machine would not reuse them)."""
    if not results.is_file():
        return {}
    import pyarrow.parquet as pq

    by_job = {row["job_id"]: row for row in pq.read_table(results).to_pylist()}
    return {p["key"]: by_job[p["pair_id"] + suffix] for p in pairs if p["pair_id"] + suffix in by_job}


# ---------------------------------------------------------------- comparison (pure)

def ours_verdicts(row: dict | None, protocols: dict) -> dict:
    from dicepipe.judgement import judge

    out = {"ours_compiled": None if row is None else bool(row.get("compiled"))}
    for name, protocol in protocols.items():
        out[f"ours_{name}"] = None if row is None else judge(row, protocol=protocol, robust=False)
    return out


def kb_verdicts(entries: dict, key: str, tolerances: list[float], run_index: int = 0) -> dict:
    out = {}
    for tol in tolerances:
        entry = entries.get((key, tol, run_index))
        tag = f"{tol:g}"
        out[f"kb_compiled_{tag}"] = None if entry is None else entry["compiled"]
        out[f"kb_correct_{tag}"] = None if entry is None else entry["correctness"]
        out[f"kb_status_{tag}"] = None if entry is None else entry["status"]
        meta = (entry or {}).get("metadata") or {}
        out[f"kb_trials_{tag}"] = meta.get("correctness_trials")
        out[f"kb_error_{tag}"] = first_line(next((meta[k] for k in (
            "compilation_error", "runtime_error", "cuda_error", "other_error", "error",
            "correctness_issue") if meta.get(k)), None))
    return out


def first_line(text) -> str | None:
    if not text:
        return None
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return lines[0][:200] if lines else None


def compare(record: dict, protocol: str, tol: float) -> bool | None:
    """(compiled, correct) the same on both sides (a record holds ours_verdicts and
    kb_verdicts); None where a side has no result."""
    tag = f"{tol:g}"
    if record.get("ours_compiled") is None or record.get(f"kb_compiled_{tag}") is None:
        return None
    our_correct = record[f"ours_{protocol}"] == "accepted"
    return (bool(record["ours_compiled"]) == bool(record[f"kb_compiled_{tag}"])
            and our_correct == bool(record[f"kb_correct_{tag}"]))


# verdicts compared between the first run and each re-run of a disagreeing pair
RERUN_FIELDS = {"kb_correct_0.0001": "KernelBench at 1e-4", "kb_correct_0.01": "KernelBench at 1e-2",
                "kb_compiled_0.0001": "KernelBench's compiled",
                "ours_kernelbench": "ours under kernelbench",
                "ours_kernelbench_v0": "ours under kernelbench_v0", "ours_compiled": "our compiled"}


def suggest_reason(record: dict, row: dict | None, facts: dict | None, reruns: list[dict]) -> str:
    """A reason for a disagreement from facts; "unexplained" when none fits (read those)."""
    reasons = []
    facts = facts or {}
    kb_wrong_where_ours_right = any(
        record.get(f"agree_{p}") is False and record.get(f"ours_{p}") == "accepted"
        for p in PROTOCOLS)
    if facts.get("integer_inputs") and kb_wrong_where_ours_right:
        reasons.append("KernelBench casts every input to fp32; this task's inputs include "
                       f"integers ({', '.join(facts.get('input_dtypes', []))})")
    if facts.get("reference_uses_rng") and kb_wrong_where_ours_right:
        reasons.append("the reference draws random numbers: KernelBench runs the candidate on "
                       "the RNG state the reference left, the harness re-seeds it")
    if facts.get("reference_error"):
        reasons.append(f"the reference fails on its own: {facts['reference_error'][:120]}")
    tolerances = [float(t) for t in (row or {}).get("kb_trial_tolerance") or []]
    for protocol, tol in PROTOCOLS.items():
        if record.get(f"agree_{protocol}") is False and tolerances and any(
                abs(t / tol - 1) < 1e-3 for t in tolerances if math.isfinite(t)):
            reasons.append(f"a trial's needed tolerance is at the boundary of {tol:g}")
    changed = sorted({label for rerun in reruns for field, label in RERUN_FIELDS.items()
                      if rerun.get(field) is not None and rerun.get(field) != record.get(field)})
    if changed:
        reasons.append(f"nondeterministic: {', '.join(changed)} changed across "
                       f"{len(reruns)} re-run(s)")
    elif reruns:
        reasons.append(f"reproduced in {len(reruns)} re-run(s)")
    theirs = " ".join(str(x) for x in (record.get("kb_error_0.0001"), record.get("kb_error_0.01")) if x)
    ours = str((row or {}).get("error") or "")
    if any(s in theirs.lower() for s in ("out of memory", "outofmemoryerror")):
        reasons.append("out of memory: KernelBench ran out of GPU memory (its jobs and our "
                       "workers share one GPU; the re-runs go fewer at a time)")
    if any(s in ours.lower() for s in ("out of memory", "outofmemoryerror")):
        reasons.append("out of memory: our worker ran out of GPU memory (shared GPU)")
    if "worker memory passed" in ours.lower():
        reasons.append("our worker's host memory limit (harness.measure.memory_limit_mb; "
                       "KernelBench runs without one)")
    if "timeout" in ours.lower() and not any(record.get(f"kb_status_{t}") == "timeout"
                                            for t in ("0.0001", "0.01")):
        reasons.append("our run phase limit (harness.measure.run_timeout_s; KernelBench's "
                       "script gives a pair 180 s)")
    for tag in ("0.0001", "0.01"):
        if record.get(f"kb_status_{tag}") == "timeout":
            reasons.append(f"KernelBench's run at {tag} timed out")
            break
    if not reasons or all(r.startswith("reproduced") for r in reasons):
        ours = record.get("ours_error") and f"ours: {record.get('ours_error_phase')}: {record['ours_error']}"
        theirs = record.get("kb_error_0.0001") and f"KernelBench: {record['kb_error_0.0001']}"
        detail = "; ".join(x for x in (ours, theirs) if x)
        reasons.insert(0, f"unexplained ({detail})" if detail else "unexplained")
    return "; ".join(dict.fromkeys(reasons))


# ---------------------------------------------------------------- outputs

CSV_FIELDS = ["pair_id", "source", "level", "problem", "expected",
              "kb_compiled_0.0001", "kb_correct_0.0001", "kb_trials_0.0001", "kb_status_0.0001",
              "kb_compiled_0.01", "kb_correct_0.01", "kb_trials_0.01", "kb_status_0.01",
              "kb_error_0.0001", "kb_error_0.01",
              "ours_compiled", "ours_kernelbench", "ours_kernelbench_v0", "ours_kb_trial_tolerance",
              "ours_output_precision", "ours_error_phase", "ours_error",
              "agree_kernelbench", "agree_kernelbench_v0", "reruns", "reason"]


def fmt_tolerances(values) -> str:
    return " ".join("inf" if not math.isfinite(float(v)) else f"{float(v):.2g}"
                    for v in values or [])


def write_outputs(records: list[dict], out: Path, summary: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "pairs.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(records)
    lines = [("| pair | KernelBench 1e-4 (compiled, correct) | ours `kernelbench` | "
              "KernelBench 1e-2 | ours `kernelbench_v0` | our trials' tolerance | reason |"),
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in records:
        if r.get("agree_kernelbench") is False or r.get("agree_kernelbench_v0") is False:
            lines.append(f"| {r['pair_id']} | {_kb_cell(r, '0.0001')} | "
                         f"{_our_cell(r, 'kernelbench')} | {_kb_cell(r, '0.01')} | "
                         f"{_our_cell(r, 'kernelbench_v0')} | "
                         f"{r.get('ours_kb_trial_tolerance') or '-'} | {r['reason']} |")
    (out / "disagreements.md").write_text("\n".join(lines) + "\n")
    (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")


def _kb_cell(record: dict, tag: str) -> str:
    return f"{_yn(record.get(f'kb_compiled_{tag}'))}, {_yn(record.get(f'kb_correct_{tag}'))}"


def _our_cell(record: dict, protocol: str) -> str:
    return f"{_yn(record.get('ours_compiled'))}, {_yn(record.get(f'ours_{protocol}') == 'accepted')}"


def _our_yn(record: dict, protocol: str) -> str:
    verdict = record.get(f"ours_{protocol}")
    return _yn(None if verdict is None else verdict == "accepted")


def _yn(value) -> str:
    return "-" if value is None else ("yes" if value else "no")


def add_reruns(rerun_data: dict, pairs, kb_entries, rows, tolerances, protocols, run_index) -> None:
    """Re-run `run_index` of each pair, for the pairs it has a result of on either side (a
    budget can end the re-runs part way: a pair not re-run is not "reproduced")."""
    for pair in pairs:
        rerun = dict(kb_verdicts(kb_entries, pair["key"], tolerances, run_index),
                     **ours_verdicts(rows.get(pair["key"]), protocols), run=run_index)
        if all(rerun.get(f) is None for f in RERUN_FIELDS):
            continue
        for protocol, tol in PROTOCOLS.items():
            rerun[f"agree_{protocol}"] = compare(rerun, protocol, tol)
        rerun_data.setdefault(pair["key"], []).append(rerun)


def build_records(pairs, rows, kb_entries, tolerances, protocols, facts, rerun_data) -> list[dict]:
    records = []
    for pair in pairs:
        row = rows.get(pair["key"])
        record = {k: pair.get(k) for k in ("pair_id", "source", "level", "problem", "expected")}
        record.update(kb_verdicts(kb_entries, pair["key"], tolerances))
        record.update(ours_verdicts(row, protocols))
        if row is not None:
            record.update(ours_kb_trial_tolerance=fmt_tolerances(row.get("kb_trial_tolerance")),
                          ours_output_precision=row.get("output_precision"),
                          ours_error_phase=row.get("error_phase"),
                          ours_error=first_line(row.get("error")))
        for protocol, tol in PROTOCOLS.items():
            record[f"agree_{protocol}"] = compare(record, protocol, tol)
        reruns = rerun_data.get(pair["key"], [])
        record["reruns"] = "; ".join(
            f"run {r['run']}: kb {_yn(r.get('kb_correct_0.0001'))}/{_yn(r.get('kb_correct_0.01'))}"
            f" ours {_our_yn(r, 'kernelbench')}/{_our_yn(r, 'kernelbench_v0')}" for r in reruns)
        disagree = any(record[f"agree_{p}"] is False for p in PROTOCOLS)
        record["reason"] = (suggest_reason(record, row, facts.get(pair["key"]), reruns)
                            if disagree else "")
        records.append(record)
    return records


def summarize(records: list[dict], walls: dict, stubs: set) -> dict:
    def block(subset):
        counts = {"pairs": len(subset)}
        for p in PROTOCOLS:
            values = [r[f"agree_{p}"] for r in subset]
            counts[f"agree_{p}"] = sum(v is True for v in values)
            counts[f"disagree_{p}"] = sum(v is False for v in values)
            counts[f"missing_{p}"] = sum(v is None for v in values)
            counts[f"ours_correct_{p}"] = sum(r.get(f"ours_{p}") == "accepted" for r in subset)
        for tag in ("0.0001", "0.01"):
            counts[f"kb_correct_{tag}"] = sum(bool(r.get(f"kb_correct_{tag}")) for r in subset)
        return counts

    by_source: dict[str, list] = {}
    for r in records:
        by_source.setdefault(r["source"], []).append(r)
    return {"total": block(records), "by_source": {s: block(v) for s, v in sorted(by_source.items())},
            "disagreements": [r["pair_id"] for r in records if r["reason"]],
            "reasons": dict(Counter(r["reason"] for r in records if r["reason"])),
            "wall_s": walls, "kernelbench_stubs": sorted(stubs)}


# ---------------------------------------------------------------- main

def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parquet", type=Path, required=True,
                        help="KernelBench levels 1-3 parquet (../shared/data/kernelbench)")
    parser.add_argument("--kernelbench", type=Path, required=True,
                        help="KernelBench 423217d folder (holds src/kernelbench)")
    parser.add_argument("--out", type=Path, required=True, help="tables and summary")
    parser.add_argument("--state", type=Path, default=None,
                        help="journals, files, builds (resumed if present; default OUT/state)")
    parser.add_argument("--params", type=Path, default=ROOT / "params.yaml")
    parser.add_argument("--sources", nargs="+", default=["copies", "adversarial", "templates"],
                        choices=["copies", "adversarial", "templates", "corpus"])
    parser.add_argument("--corpus", type=Path, default=None)
    parser.add_argument("--levels", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--limit", type=int, default=None, help="copies: first N per level")
    parser.add_argument("--tasks", nargs="+", default=None,
                        help="copies: only these task ids (L1/95_CrossEntropyLoss ...)")
    parser.add_argument("--backend", default="cuda", choices=["cuda", "cpu"],
                        help="our harness's backend (cpu: a dry run of the copies)")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--kb-tolerances", nargs="+", type=float, default=[1e-4, 1e-2])
    parser.add_argument("--kb-jobs", type=int, default=max(1, min(8, (os.cpu_count() or 2) // 2)),
                        help="KernelBench processes at a time")
    parser.add_argument("--kb-timeout", type=float, default=180.0,
                        help="seconds per pair and tolerance (KernelBench's script: 180)")
    parser.add_argument("--kb-build-timeout", type=float, default=600.0,
                        help="extra seconds for a pair whose candidate builds an extension")
    parser.add_argument("--kb-mode", default="probe", choices=["probe", "separate"],
                        help="probe: one eval_kernel_against_ref at the first tolerance, its "
                             "allclose calls re-evaluated at the others (half the input draws); "
                             "separate: one run per tolerance, get_tolerance_for_precision patched")
    parser.add_argument("--kb-host-gb", type=float, default=48.0,
                        help="host memory the KernelBench processes' input sets may take at once")
    parser.add_argument("--harness-workers", type=int, default=4,
                        help="our harness's device workers on the one GPU (correctness only, "
                             "so they may share it; cuda backend). Level 1: use 1, since "
                             "workers sharing a GPU count each other's memory as leaks")
    parser.add_argument("--harness-chunk", type=int, default=64,
                        help="pairs per harness call (the budget is checked between calls; 0: one)")
    parser.add_argument("--cuda-arch", default=None, help="TORCH_CUDA_ARCH_LIST for KernelBench's builds")
    parser.add_argument("--cache-dir", type=Path, default=None, help="our harness's build cache")
    parser.add_argument("--sequential", action="store_true",
                        help="run KernelBench's side first, then ours (default: at the same time; "
                             "the harness then replaces workers for memory the other side used)")
    parser.add_argument("--skip-kernelbench", action="store_true")
    parser.add_argument("--skip-harness", action="store_true",
                        help="run nothing on our side: our rows are those --state's results files hold")
    parser.add_argument("--kb-emulate-cpu", action="store_true",
                        help="test mode without CUDA: KernelBench's CUDA calls become no-ops")
    parser.add_argument("--rerun-disagreements", type=int, default=0, metavar="N",
                        help="re-run each disagreeing pair N times under both")
    parser.add_argument("--rerun-jobs", type=int, default=1,
                        help="re-runs of disagreements: KernelBench's jobs at a time, then our "
                             "device workers (1: each job alone on the GPU)")
    parser.add_argument("--from-state", action="store_true",
                        help="run nothing: build the tables from what --state holds (KernelBench's "
                             "journal, our results files, diagnoses), e.g. on a laptop after a GPU run")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="start no new KernelBench pair, and no re-run, after this many seconds")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, kill_children)
    began = time.monotonic()
    deadline = began + args.budget_s if args.budget_s else None
    state = args.state or args.out / "state"
    state.mkdir(parents=True, exist_ok=True)
    pairs = gather_pairs(args)
    write_files(pairs, state)
    log(f"{len(pairs)} pairs: {dict(Counter(p['source'] for p in pairs))}; state in {state}")

    from dicepipe.judgement import named_protocol

    _, table = harness_settings(args)
    protocols = {name: named_protocol(name, table) for name in PROTOCOLS}
    kb = KernelBenchSide(args, state)
    walls: dict = {}
    rows: dict = {}
    errors: list = []

    def kb_side():
        start = time.monotonic()
        try:
            kb.run(pairs, 0, deadline)
        except BaseException as exc:  # noqa: BLE001 - reported after our side finishes
            errors.append(exc)
        walls["kernelbench"] = round(time.monotonic() - start, 1)

    thread = None
    if not (args.skip_kernelbench or args.from_state):
        thread = threading.Thread(target=kb_side, daemon=True)
        thread.start()
        if args.sequential:
            thread.join()
    start = time.monotonic()
    rows = run_harness(pairs, args, state, 0, deadline)  # saved rows only under --skip-harness
    walls["harness"] = round(time.monotonic() - start, 1)
    if thread is not None:
        thread.join()
    if errors:
        raise errors[0]

    tolerances = kb.tolerances
    entries = kb.done()
    records = build_records(pairs, rows, entries, tolerances, protocols, {}, {})
    disagreeing = [p for p, r in zip(pairs, records) if r["reason"]]
    facts, rerun_data = {}, {}
    if disagreeing and args.from_state:
        facts = {e["key"]: e for e in Journal(state / "diagnose.jsonl").read()}
        for run_index in range(1, args.rerun_disagreements + 1):
            again = run_harness(disagreeing, args, state, run_index)
            add_reruns(rerun_data, disagreeing, entries, again, tolerances, protocols, run_index)
    elif disagreeing and not args.skip_kernelbench:
        # out-of-memory ones are explained already, and running their multi-GB references
        # again only to diagnose them takes minutes each
        unexplained = [p for p, r in zip(pairs, records)
                       if r["reason"] and "out of memory" not in r["reason"]]
        log(f"{len(disagreeing)} disagreements: diagnosing the references of {len(unexplained)}")
        facts = kb.diagnose(unexplained)
        for run_index in range(1, args.rerun_disagreements + 1):
            if deadline is not None and time.monotonic() > deadline:
                log("budget spent: no more re-runs")
                break
            log(f"re-run {run_index} of {len(disagreeing)} disagreeing pairs, KernelBench's "
                f"{args.rerun_jobs} at a time, then ours on {args.rerun_jobs} worker(s)")
            # alone on the GPU: level 1's multi-GB inputs make concurrent jobs run out of memory
            alone = argparse.Namespace(**{**vars(args), "kb_jobs": args.rerun_jobs,
                                          "harness_workers": args.rerun_jobs})
            KernelBenchSide(alone, state).run(disagreeing, run_index, deadline)
            again = run_harness(disagreeing, alone, state, run_index, deadline)
            entries = kb.done()
            add_reruns(rerun_data, disagreeing, entries, again, tolerances, protocols, run_index)
    records = build_records(pairs, rows, entries, tolerances, protocols, facts, rerun_data)
    walls["total"] = round(time.monotonic() - began, 1)
    stubs = {s for e in entries.values() for s in e.get("stubs") or []}
    summary = summarize(records, walls, stubs)
    write_outputs(records, args.out, summary)
    total = summary["total"]
    log(f"agree kernelbench {total['agree_kernelbench']}/{total['pairs']} "
        f"(missing {total['missing_kernelbench']}), kernelbench_v0 "
        f"{total['agree_kernelbench_v0']}/{total['pairs']} (missing "
        f"{total['missing_kernelbench_v0']}); wall {walls}")
    for source, counts in summary["by_source"].items():
        log(f"  {source}: {json.dumps(counts, sort_keys=True)}")
    print((args.out / "disagreements.md").read_text())
    if stubs:
        log(f"KernelBench ran with stand-ins for {sorted(stubs)} (not installed here)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
