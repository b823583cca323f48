"""Verify the CUDA templates on a GPU: every family at two shapes (its smallest and its
largest task), through the harness exactly as the augment stage runs them.

    PYTHONPATH=workflow python3 bench/augment_cuda.py --out OUT [--attempts 2] [--budget-s 150]

Reads params.yaml without the schema check (the GPU machine may lack jsonschema). Writes
OUT/attempts.jsonl, OUT/report.json and OUT/summary.md, and prints the summary. The harness
state lives in OUT/work, so a second round (another attempt for tasks not yet kept) is free
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

from dicepipe.augment import generate_tasks  # noqa: E402
from dicepipe.augment.authors.templates import TemplateAuthor  # noqa: E402
from dicepipe.augment.loop import run_attempts  # noqa: E402
from dicepipe.augment.records import build_report  # noqa: E402
from dicepipe.harness import HarnessSettings  # noqa: E402


def two_shapes_per_family(settings: dict) -> list:
    settings = dict(settings, max_tasks={})
    by_family: dict[str, list] = {}
    for task in generate_tasks(settings, "cuda"):
        by_family.setdefault(task.family, []).append(task)
    chosen = []
    for family in settings["families"]:
        tasks = sorted(by_family[family],
                       key=lambda t: (t.shape.batch * t.shape.seq * t.shape.hidden, t.task_id))
        chosen.extend([tasks[0], tasks[-1]])
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--attempts", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--budget-s", type=float, default=150.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    start = time.monotonic()
    params = yaml.safe_load(Path(args.params).read_text())
    settings = dict(params["augment"], author="templates")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tasks = two_shapes_per_family(settings)
    harness = HarnessSettings.from_params(params["harness"], repeats=args.repeats,
                                          decision_thresholds=(settings["speedup_threshold"],),
                                          cache_dir=out / "work" / "builds")
    rows, kept = [], {}
    for attempts in range(1, args.attempts + 1):
        if attempts > 1 and time.monotonic() - start > 0.6 * args.budget_s:
            logging.info("skipping attempt round %d: %.0f s spent", attempts,
                         time.monotonic() - start)
            break
        rows, kept = run_attempts(tasks, TemplateAuthor(), dict(settings, attempts=attempts),
                                  harness, out / "work", robust=bool(params["harness"]["robust"]))
    report = build_report(tasks, rows, {"backend": "cuda", "author": "templates",
                                        "speedup_threshold": settings["speedup_threshold"],
                                        "speedup_statistic": settings["speedup_statistic"]})
    report["correct_tasks"] = len({r["task_id"] for r in rows if r["correct_robust"]})
    report["faster_tasks_by_median"] = len({r["task_id"] for r in rows
                                            if r["correct_robust"] and (r["speedup"] or 0) > 1.0})
    report["wall_s"] = round(time.monotonic() - start, 1)
    with open(out / "attempts.jsonl", "w") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
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
