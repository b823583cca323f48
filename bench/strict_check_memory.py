"""Peak GPU memory of the harness's checks beside KernelBench's own check, per task.

For the largest KernelBench level-1 tasks (by the bytes of their inputs and output, sized on
the meta device, nothing allocated), each task's reference copy (ModelNew a textual copy of
Model, as evaluation's reference check and the folder baseline score it) is judged twice in
this process, one after the other, with the allocator's peak reset before each:

  ours        the device job as a worker runs it: the reference's probe (`op: probe`), then
              `run_job` with measure_speed=False (KernelBench's trials and the strict ones,
              each in the memory plan that fits: memory_plans.py);
  kernelbench KernelBench 423217d's check: `--kernelbench DIR` runs its own
              `eval_kernel_against_ref` (DIR: a KernelBench checkout, src/ inside, as
              bench/kernelbench_differential.py takes it); without it, this file's copy of its
              comparison loop (`kernelbench_check`: models built under seed 42 on the CPU and
              moved with fp32 casts, per trial its seed, `get_inputs()` on the CPU cast to fp32
              and moved, the reference then the candidate on the same tensors, a shape check,
              `torch.allclose(atol=rtol=1e-4)` and on failure max/mean |difference|).

Each row: the task, its input and output GiB (I, O), our peak and the plan our strict trials
ran in, KernelBench's peak, and whether ours is within the stated bound (device plan
2I + 2O + C + both models' parameters + 1 GiB, C the reference's own call above its inputs,
measured on one draw: its output and intermediates; 2I + 3O for an elementwise task). Peaks are `torch.cuda.max_memory_allocated` above what was
allocated before the job (torch's allocator: what the checks hold; the CUDA context and
library workspaces are outside it for both sides alike).

    PYTHONPATH=$PWD/workflow python3 bench/strict_check_memory.py --out $OUT/strict_memory.json

About 4-6 minutes on one H100 (host-side draws of KernelBench's multi-GB inputs dominate:
`--kb-trials` 1 on both sides, since their trials keep nothing from one to the next; tasks
go largest first and none starts after `--budget-s`; the JSON is rewritten after each).
Without a GPU: `--dry-run` lists the tasks and sizes; `--device cpu --pick smallest
--count 3` runs both sides on the smallest tasks (no peak figures on the CPU).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
import types
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
PARQUET = ROOT / "data" / "kernelbench" / "kernelbench_levels_1-3.parquet"
GIB = 2**30
MARGIN_BYTES = GIB
KERNELBENCH_FP32_TOLERANCE = 1e-4


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def load_tasks(parquet: Path, level: int) -> list[dict]:
    from dicepipe.data.benchmark import load_benchmark

    spec = {"kind": "parquet", "path": str(parquet), "levels": [level], "version": "423217d"}
    return load_benchmark(spec).to_pylist()


def program(code: str, name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    exec(compile(code, f"<{name}>", "exec"), module.__dict__)  # noqa: S102 - the task's own file
    return module


def _bytes(obj) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, (list, tuple)):
        return sum(_bytes(x) for x in obj)
    return 0


def task_size(code: str) -> dict:
    """Input, output and parameter bytes of a task, on the meta device (nothing allocated).
    The output is None where an operator has no meta implementation."""
    with torch.device("meta"):  # module-level tensors too
        module = program(code, "sizing")
        torch.manual_seed(42)
        inputs = module.get_inputs()
        out = {"input_bytes": _bytes(inputs), "output_bytes": None, "param_bytes": None}
        try:
            model = module.Model(*module.get_init_inputs())
            out["param_bytes"] = sum(_bytes(p) for p in model.state_dict().values())
            with torch.no_grad():
                out["output_bytes"] = _bytes(model(*inputs))
        except Exception as exc:  # noqa: BLE001 - sizing is best effort
            out["sizing_error"] = f"{type(exc).__name__}: {str(exc)[:120]}"
    return out


def pick_tasks(tasks: list[dict], count: int, pick: str, wanted: list[str] | None) -> list[dict]:
    sized = []
    for task in tasks:
        if wanted and task["task_id"] not in wanted:
            continue
        try:
            size = task_size(task["reference_code"])
        except Exception as exc:  # noqa: BLE001
            log(f"{task['task_id']}: not sized ({type(exc).__name__}: {str(exc)[:100]})")
            continue
        sized.append(dict(task, **size))
    sized.sort(key=lambda t: t["input_bytes"] + (t["output_bytes"] or 0),
               reverse=pick == "largest")
    return sized if wanted else sized[:count]


class _Context:
    """What a device worker's context gives `run_job` and `run_probe`, in this process."""

    def __init__(self, device: str, folder: Path):
        from kernelharness.worker.guards import ThreadWatch

        self.device, self.toolchain, self.extensions = device, {}, {}
        self.cache = self.folder = self.job_folder = folder
        self.current_phase = "load"
        self.thread_watch = ThreadWatch()
        self.base_threads = 1_000

    def phase(self, name: str, timeout_s: float) -> None:
        self.current_phase = name.split(":")[0]


def measured(device: str, fn):
    """(fn's result, its peak bytes above what was allocated before, seconds)."""
    gc.collect()
    start = time.monotonic()
    if device != "cuda":
        return fn(), None, time.monotonic() - start
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    result = fn()
    torch.cuda.synchronize()
    return result, torch.cuda.max_memory_allocated() - before, time.monotonic() - start


def our_job(task: dict, settings: dict, device: str) -> dict:
    from dicepipe.data.benchmark import reference_copy
    from kernelharness.orchestrator import job_seed
    from kernelharness.worker.device_job import run_job, run_probe

    seed = job_seed(int(settings["seed"]), task["reference_code"])
    with tempfile.TemporaryDirectory() as folder:
        ctx = _Context(device, Path(folder))
        probe = {"op": "probe", "reference_code": task["reference_code"], "seed": seed,
                 "plan": [], "settings": settings}
        plan, probe_peak, probe_s = measured(device, lambda: run_probe(probe, ctx)["row"])
        job = {"reference_code": task["reference_code"],
               "candidate_code": reference_copy(task["reference_code"]), "seed": seed,
               "settings": settings, "measure_speed": False, "variant_plan": plan.get("plan")}
        row, job_peak, job_s = measured(device, lambda: run_job(job, ctx)["row"])
    note = row.get("error") or ""
    memory_plan = next((name for name in ("leanest", "host") if f"memory plan '{name}'" in note),
                       "device")
    return {"correct": bool(row.get("correct")), "kb_trial_tolerance": row.get("kb_trial_tolerance"),
            "error_phase": row.get("error_phase"), "error": note[-400:] or None,
            "memory_plan": memory_plan, "probe_peak_bytes": probe_peak,
            "job_peak_bytes": job_peak, "wall_s": probe_s + job_s}


def kernelbench_check(reference_code: str, candidate_code: str, trials: int, device: str) -> dict:
    """KernelBench 423217d's eval_kernel_against_ref (correctness only, fp32) as far as its
    memory goes: `load_original_model_and_inputs`, models built under set_seed(42),
    `run_and_check_correctness`'s loop. The same semantics, not a new check."""
    def set_seed(seed):
        torch.manual_seed(seed)
        if device == "cuda":
            torch.cuda.manual_seed(seed)

    def process(x):  # _process_input_tensor: every tensor cast to the precision, then moved
        return x.to(dtype=torch.float32).to(device=device) if isinstance(x, torch.Tensor) else x

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    ref_mod, cand_mod = program(reference_code, "kb_reference"), program(candidate_code, "kb_new")
    set_seed(42)
    init_inputs = [process(x) for x in ref_mod.get_init_inputs()]
    with torch.no_grad():
        set_seed(42)
        original = ref_mod.Model(*init_inputs)
        set_seed(42)
        custom = cand_mod.ModelNew(*init_inputs)
    torch.manual_seed(42)
    seeds = [torch.randint(0, 2**32 - 1, (1,)).item() for _ in range(trials)]
    passed, metadata = 0, {}
    with torch.no_grad():
        for seed in seeds:
            set_seed(seed)
            inputs = [process(x) for x in ref_mod.get_inputs()]
            set_seed(seed)
            model = original.to(device=device, dtype=torch.float32)
            set_seed(seed)
            model_new = custom.to(device=device, dtype=torch.float32)
            output = model(*inputs)
            sync()
            try:
                output_new = model_new(*inputs)
                sync()
                if output.shape != output_new.shape:
                    return {"correct": False, "passed": passed, "error": "shape mismatch"}
                if not torch.allclose(output, output_new, atol=KERNELBENCH_FP32_TOLERANCE,
                                      rtol=KERNELBENCH_FP32_TOLERANCE):
                    metadata.setdefault("max_difference", []).append(
                        float(torch.max(torch.abs(output - output_new))))
                    metadata.setdefault("avg_difference", []).append(
                        float(torch.mean(torch.abs(output - output_new))))
                else:
                    passed += 1
            except Exception as exc:  # noqa: BLE001 - KernelBench records it and returns
                return {"correct": False, "passed": passed, "error": str(exc)[:300]}
            del inputs, output, output_new
    return {"correct": passed == trials, "passed": passed, "error": None, **metadata}


def kernelbench_own(kb_src: Path, reference_code: str, candidate_code: str,
                    trials: int) -> dict:
    """KernelBench's own eval_kernel_against_ref, imported from its checkout."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from kernelbench_eval_child import import_kernelbench

    kb_eval, _stubs = import_kernelbench(str(kb_src / "src"))
    with tempfile.TemporaryDirectory() as build_dir:
        result = kb_eval.eval_kernel_against_ref(
            reference_code, candidate_code, seed_num=42, num_correct_trials=trials,
            measure_performance=False, build_dir=build_dir, device=torch.device("cuda:0"))
    if result is None:
        return {"correct": False, "passed": 0, "error": "KernelBench asked for a retry (None)"}
    return {"correct": bool(result.correctness), "passed": None,
            "error": None if result.correctness else str(result.metadata)[:300]}


def kernelbench_side(task: dict, args) -> dict:
    from dicepipe.data.benchmark import reference_copy

    candidate = reference_copy(task["reference_code"])

    def run():
        try:
            if args.kernelbench:
                return kernelbench_own(args.kernelbench, task["reference_code"], candidate,
                                       args.kb_trials)
            return kernelbench_check(task["reference_code"], candidate, args.kb_trials,
                                     args.device)
        except torch.OutOfMemoryError as exc:
            return {"correct": False, "passed": None, "error": "out of memory: " + str(exc)[:200]}
        except Exception as exc:  # noqa: BLE001 - recorded; the other tasks still run
            return {"correct": False, "passed": None,
                    "error": f"{type(exc).__name__}: {str(exc)[:300]}"}

    result, peak, seconds = measured(args.device, run)
    return dict(result, peak_bytes=peak, wall_s=seconds)


def call_peak_bytes(task: dict, device: str) -> int | None:
    """C: the reference's own call above its inputs (its output and its intermediates), on
    one as-drawn input set: what any check holds while the call runs."""
    if device != "cuda":
        return None
    module = program(task["reference_code"], "call_peak")
    torch.manual_seed(42)
    model = module.Model(*module.get_init_inputs()).to(device)
    with torch.device(device):
        inputs = module.get_inputs()

    def call():
        with torch.no_grad():
            model(*inputs)  # the output is freed on return: its bytes are in the peak

    return measured(device, call)[1]


def bound_bytes(task: dict) -> int | None:
    """The device plan's bound: a pristine and a call's input set, the reference's and the
    first candidate output kept, the running call's own peak (C, its output included), the
    parameters of both models, and the margin (blocks of the comparisons and variants)."""
    if task.get("output_bytes") is None or task.get("call_peak_bytes") is None:
        return None
    return (2 * task["input_bytes"] + 2 * task["output_bytes"] + task["call_peak_bytes"]
            + 2 * (task.get("param_bytes") or 0) + MARGIN_BYTES)


def gib(value) -> str:
    return "-" if value is None else f"{value / GIB:.2f}"


def table(rows: list[dict]) -> list[str]:
    lines = [("| task | I GiB | O GiB | ours peak GiB (plan) | bound GiB | within | "
              "KernelBench peak GiB | ours / KB | ours correct | KB correct |"),
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        ours, kb = row["ours"], row["kernelbench"]
        peak = ours.get("job_peak_bytes")
        if peak is not None and ours.get("probe_peak_bytes") is not None:
            peak = max(peak, ours["probe_peak_bytes"])
        ratio = (f"{peak / kb['peak_bytes']:.2f}" if peak and kb.get("peak_bytes") else "-")
        within = "-" if peak is None or row["bound_bytes"] is None else (
            "yes" if peak <= row["bound_bytes"] else "NO")
        lines.append(f"| {row['task_id']} | {gib(row['input_bytes'])} | "
                     f"{gib(row['output_bytes'])} | {gib(peak)} ({ours['memory_plan']}) | "
                     f"{gib(row['bound_bytes'])} | {within} | {gib(kb.get('peak_bytes'))} | "
                     f"{ratio} | {ours['correct']} | {kb['correct']} |")
    return lines


def write(args, rows: list[dict], started: float) -> None:
    gpu = args.device == "cuda" and torch.cuda.is_available()
    summary = {"device": torch.cuda.get_device_name(0) if gpu else "cpu",
               "torch": torch.__version__, "strict_trials": args.strict_trials,
               "kb_trials": args.kb_trials, "margin_bytes": MARGIN_BYTES,
               "kernelbench": "own" if args.kernelbench else "loop copy",
               "wall_s": round(time.monotonic() - started, 1), "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=1, sort_keys=True, default=str))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON file for the rows")
    parser.add_argument("--parquet", type=Path, default=PARQUET)
    parser.add_argument("--level", type=int, default=1)
    parser.add_argument("--count", type=int, default=10)
    parser.add_argument("--pick", choices=["largest", "smallest"], default="largest")
    parser.add_argument("--tasks", nargs="*", help="task ids instead of picking by size")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--strict-trials", type=int, default=5)
    parser.add_argument("--kb-trials", type=int, default=1,
                        help="KernelBench's trials on both sides (a trial's peak does not "
                             "grow after the first; their host-side draws cost the time)")
    parser.add_argument("--kernelbench", type=Path, default=None,
                        help="a KernelBench checkout: run its own eval_kernel_against_ref")
    parser.add_argument("--budget-s", type=float, default=300.0,
                        help="start no task after this many seconds (rows so far are kept)")
    parser.add_argument("--dry-run", action="store_true", help="list the tasks and sizes only")
    args = parser.parse_args(argv)

    from kernelharness import HarnessSettings

    started = time.monotonic()
    tasks = pick_tasks(load_tasks(args.parquet, args.level), args.count, args.pick, args.tasks)
    log(f"{len(tasks)} tasks: " + ", ".join(
        f"{t['task_id']} ({gib(t['input_bytes'])}+{gib(t['output_bytes'])} GiB)" for t in tasks))
    settings = HarnessSettings.with_defaults(
        correct_trials=args.strict_trials, kernelbench_trials=args.kb_trials,
        cache_dir=tempfile.gettempdir()).to_wire()
    rows = []
    for task in tasks:
        row = {k: task.get(k) for k in ("task_id", "input_bytes", "output_bytes", "param_bytes",
                                        "sizing_error")}
        if args.dry_run:
            rows.append(row)
            continue
        if time.monotonic() - started > args.budget_s:
            log(f"budget of {args.budget_s:.0f} s spent: {task['task_id']} and later not run")
            break
        task["call_peak_bytes"] = row["call_peak_bytes"] = call_peak_bytes(task, args.device)
        row["bound_bytes"] = bound_bytes(task)
        log(f"{task['task_id']}: ours")
        try:
            row["ours"] = our_job(task, settings, args.device)
        except Exception as exc:  # noqa: BLE001 - recorded; the other tasks still run
            row["ours"] = {"correct": False, "memory_plan": "-", "job_peak_bytes": None,
                           "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        log(f"{task['task_id']}: ours peak {gib(row['ours']['job_peak_bytes'])} GiB "
            f"({row['ours']['memory_plan']}), correct {row['ours']['correct']}; KernelBench's")
        row["kernelbench"] = kernelbench_side(task, args)
        log(f"{task['task_id']}: KernelBench peak {gib(row['kernelbench']['peak_bytes'])} GiB, "
            f"correct {row['kernelbench']['correct']}")
        rows.append(row)
        gc.collect()
        if args.device == "cuda":
            torch.cuda.empty_cache()
        write(args, rows, started)
    write(args, rows, started)
    if not args.dry_run:
        print("\n".join(table(rows)))
    else:
        for row in rows:
            print(f"{row['task_id']}: inputs {gib(row['input_bytes'])} GiB, output "
                  f"{gib(row['output_bytes'])} GiB, parameters {gib(row['param_bytes'])} GiB")
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
