"""Verify the CUDA templates on a GPU: every family at two shapes (its smallest and its
largest task), through the harness exactly as the augment stage runs them.

    PYTHONPATH=workflow python3 bench/augment_cuda.py --out OUT [--attempts 2] [--budget-s 150]

Reads params.yaml without the schema check (the GPU machine may lack jsonschema). Writes
OUT/attempts.jsonl, OUT/report.json and OUT/summary.md, and prints the summary. The harness
state lives in --work-dir, so a second round (another attempt for tasks not yet kept) is free
to resume the first; the second round is skipped when the time budget is nearly spent."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "workflow"))

from dicepipe.augment import generate_tasks
from dicepipe.augment.authors.templates import TemplateAuthor
from dicepipe.augment.loop import run_attempts
from dicepipe.augment.records import build_report
from kernelharness import HarnessSettings

FALLBACK_DOC = """Direct check, used only when the harness cannot run here: each kernel is built
in its own process (in parallel), then every task's first variant is compared with its
reference on three input draws (atol = rtol = 1e-4) and both are timed with CUDA events."""


def two_shapes_per_family(settings: dict) -> list:
    settings = dict(settings, max_tasks={})
    by_family: dict[str, list] = {}
    for task in generate_tasks(settings, "cuda"):
        by_family.setdefault(task.family, []).append(task)
    chosen = []
    for family in settings["families"]:
        # the smallest, and the largest (the widest heads first, so head_dim 256 is covered)
        tasks = sorted(by_family[family],
                       key=lambda t: (t.shape.batch * t.shape.seq * t.shape.hidden, t.task_id))
        largest = max(tasks, key=lambda t: (t.shape.head_dim if "head_dim" in t.shape_json else 0,
                                            t.shape.batch * t.shape.seq * t.shape.hidden))
        chosen.extend([tasks[0], largest])
    return chosen


def summary_table(tasks, rows) -> str:
    lines = ["| task | attempt | compiled | correct | speedup (median) | interval | reason |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        interval = (f"{row['speedup_low']:.3f}-{row['speedup_high']:.3f}"
                    if row["speedup_low"] is not None else "-")
        speed = f"{row['speedup']:.3f}" if row["speedup"] is not None else "-"
        lines.append(f"| {row['task_id']} | {row['attempt']} | {row['compiled']} | "
                     f"{row['correct_robust']} | {speed} | {interval} | {row['reason']} |")
    return "\n".join(lines)


def _exec(code: str, name: str):
    import types

    module = types.ModuleType(name)
    exec(compile(code, name, "exec"), module.__dict__)
    return module


def direct_check(tasks, out: Path) -> list[dict]:
    import os
    import subprocess

    import torch
    from dicepipe.augment.families import FAMILIES

    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(out / "direct_ext"))
    author = TemplateAuthor()
    files = {t.task_id: author.write(t, 0).code for t in tasks}
    one_per_kernel = {FAMILIES[t.family].kernel: files[t.task_id] for t in tasks}
    procs = [subprocess.Popen([sys.executable, "-c", code]) for code in one_per_kernel.values()]
    for proc in procs:
        proc.wait()
    rows = []
    for task in tasks:
        row = {"task_id": task.task_id, "attempt": 0, "compiled": False, "correct_robust": False,
               "speedup": None, "speedup_low": None, "speedup_high": None, "reason": "build_failed"}
        try:
            ref, cand = _exec(task.reference_code, "ref"), _exec(files[task.task_id], "cand")
            row["compiled"], row["reason"] = True, "incorrect"
            torch.manual_seed(0)
            model = ref.Model(*ref.get_init_inputs()).cuda()
            torch.manual_seed(0)
            model_new = cand.ModelNew(*ref.get_init_inputs()).cuda()
            ok = True
            with torch.no_grad():
                for scale, shift in ((1.0, 0.0), (3.0, 1.0), (0.1, -0.5)):
                    x = (ref.get_inputs()[0] * scale + shift).cuda()
                    ok &= torch.allclose(model(x), model_new(x), atol=1e-4, rtol=1e-4)
                x = ref.get_inputs()[0].cuda()
                times = {}
                for name, fn in (("ref", model), ("cand", model_new)):
                    for _ in range(3):
                        fn(x)
                    samples = []
                    for _ in range(20):
                        start, end = torch.cuda.Event(True), torch.cuda.Event(True)
                        start.record()
                        fn(x)
                        end.record()
                        end.synchronize()
                        samples.append(start.elapsed_time(end))
                    times[name] = sorted(samples)[10]
            row["correct_robust"] = bool(ok)
            row["speedup"] = times["ref"] / times["cand"]
            row["reason"] = ("kept" if row["speedup"] >= 1.0 else "too_slow") if ok else "incorrect"
        except Exception as exc:  # noqa: BLE001 - recorded, the check goes on
            row["detail"] = repr(exc)[:300]
        row["kept"] = row["reason"] == "kept"
        rows.append(row)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--attempts", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--budget-s", type=float, default=150.0)
    parser.add_argument("--work-dir", default=None, help="harness state (default: OUT/work)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    start = time.monotonic()
    params = yaml.safe_load(Path(args.params).read_text())
    settings = dict(params["augment"], author="templates")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work_dir) if args.work_dir else out / "work"
    tasks = two_shapes_per_family(settings)
    harness = HarnessSettings.from_params(params["harness"], repeats=args.repeats,
                                          decision_thresholds=(settings["speedup_threshold"],),
                                          cache_dir=work / "builds")
    rows, method = [], "harness"
    try:
        for attempts in range(1, args.attempts + 1):
            if attempts > 1 and time.monotonic() - start > 0.6 * args.budget_s:
                logging.info("skipping attempt round %d: %.0f s spent", attempts,
                             time.monotonic() - start)
                break
            rows, _kept = run_attempts(tasks, TemplateAuthor(), dict(settings, attempts=attempts),
                                       harness, work, robust=bool(settings["robust"]))
    except Exception:
        logging.exception("the harness failed; falling back to the direct check")
        rows, method = direct_check(tasks, work), "direct"
    report = build_report(tasks, rows, {"backend": "cuda", "author": "templates", "method": method,
                                        "speedup_threshold": settings["speedup_threshold"],
                                        "speedup_statistic": settings["speedup_statistic"]})
    report["correct_tasks"] = len({r["task_id"] for r in rows if r["correct_robust"]})
    report["faster_tasks_by_median"] = len({r["task_id"] for r in rows
                                            if r["correct_robust"] and (r["speedup"] or 0) > 1.0})
    report["wall_s"] = round(time.monotonic() - start, 1)
    with open(out / "attempts.jsonl", "w") as fh:
        fh.writelines(json.dumps(row) + "\n" for row in rows)
    (out / "report.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    text = summary_table(tasks, rows)
    (out / "summary.md").write_text(text + "\n")
    print(text)
    print(json.dumps({k: report[k] for k in ("tasks", "tasks_with_sample", "correct_tasks",
                                             "faster_tasks_by_median", "attempts_by_reason",
                                             "wall_s")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
