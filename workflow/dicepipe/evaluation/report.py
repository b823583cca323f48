"""Evaluation outputs: the summary and per-task tables (CSV), DVC metrics (JSON) and plots.

Written deterministically (fixed column order, sorted JSON keys, PNG without a Software
stamp); the measured speedups in them are measurements and vary between runs.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..judgement import Protocol, verdict
from .metrics import VERDICTS, reference_usable

TASK_COLUMNS = ("system", "task_id", "level", "problem_id", "name", "sample", "reference_ok",
                "reference_error", "has_code", "note", "kernel_path", "compiled")
RESULT_COLUMNS = ("speedup_median", "speedup_low", "speedup_high", "launch_bound",
                  "tolerance_needed", "output_precision", "error_phase")


def _cell(value):
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "inf" if math.isinf(value) else f"{value:.6g}"
    return value


def write_csv(rows: Sequence[Mapping], path: Path, columns: Sequence[str] | None = None) -> None:
    columns = list(columns or (rows[0].keys() if rows else []))
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow(columns)
        for row in rows:
            writer.writerow([_cell(row.get(c)) for c in columns])


def task_rows(records: Sequence[Mapping], system: str,
              protocols: Sequence[Protocol]) -> list[dict]:
    """The per-task table: one row per kernel, its verdicts under each protocol and flags."""
    out = []
    for record in sorted(records, key=lambda r: (r["level"], r["problem_id"], r["name"], r["sample"])):
        result = record.get("result") or {}
        row = {k: record.get(k) for k in TASK_COLUMNS if k in record}
        row["system"] = system
        row["compiled"] = bool(result.get("compiled"))
        for protocol in protocols:
            for name, robust in VERDICTS:
                row[f"{protocol.name}.{name}.correct"] = (
                    reference_usable(record, protocol)
                    and verdict(result or None, protocol=protocol, robust=robust))
        row["flags"] = ";".join(k[5:] for k in sorted(result) if k.startswith("flag_") and result[k])
        for key in RESULT_COLUMNS:
            row[key] = result.get(key)
        row["error"] = (result.get("error") or "").strip().splitlines()[-1][:200] if result.get("error") else ""
        out.append(row)
    return out


def task_columns(protocols: Sequence[Protocol]) -> list[str]:
    verdicts = [f"{p.name}.{name}.correct" for p in protocols for name, _ in VERDICTS]
    return list(TASK_COLUMNS) + verdicts + ["flags"] + list(RESULT_COLUMNS) + ["error"]


def metrics_json(summary: Sequence[Mapping], path: Path) -> None:
    """DVC metrics: {level: {column: value}} (numbers only; `dvc metrics diff` reads them)."""
    data = {row["level"]: {k: v for k, v in row.items()
                           if k not in ("system", "level") and v is not None}
            for row in summary}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _figure(width: float, height: float, **subplots):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    matplotlib.rcParams["svg.hashsalt"] = "dicepipe"
    return plt, plt.subplots(figsize=(width, height), dpi=100, **subplots)


def _save(plt, fig, path: Path) -> None:
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, metadata={"Software": None})
    plt.close(fig)


def _share(value) -> float | None:
    try:
        return None if value in (None, "") else float(value)
    except (TypeError, ValueError):
        return None


def empty_reason(row: Mapping) -> str:
    """Why a summary row (a level, or all) has no correct kernel, in a few words: no task,
    no code, nothing compiled, or nothing correct."""
    tasks = int(_share(row.get("tasks")) or 0)
    if tasks == 0:
        failed = int(_share(row.get("reference_failed")) or 0)
        return "no task scored" + (f"\n({failed} references failed)" if failed else "")
    code, compiled = _share(row.get("with_code")), _share(row.get("compiled"))
    if code == 0:
        return f"no code written\n(0 of {tasks} tasks)"
    if compiled == 0:
        return f"code for {100 * code:.0f}% of {tasks} tasks,\nnone compiled" if code else \
            "none compiled"
    if compiled is not None:
        return f"none correct\n({100 * compiled:.0f}% of {tasks} compiled)"
    return "none correct"


def plot_levels(summary: Sequence[Mapping], protocol: str, fast_p: Sequence[float], path: Path,
                title: str) -> None:
    """Per level (and all): Exec and fast_p (point speedups), plain and robust verdicts."""
    from .metrics import p_label

    plt, (fig, ax) = _figure(7, 3.8)
    metrics = ["exec"] + [f"fast_{p_label(p)}_point" for p in fast_p]
    levels = [row["level"] for row in summary]
    bars = [(m, v) for v, _ in VERDICTS for m in metrics]
    width = 0.8 / len(bars)
    for i, (metric, verdict_name) in enumerate(bars):
        values = [100 * (row.get(f"{protocol}.{verdict_name}.{metric}") or 0.0) for row in summary]
        xs = [x + (i - (len(bars) - 1) / 2) * width for x in range(len(levels))]
        ax.bar(xs, values, width, label=f"{metric} ({verdict_name})",
               hatch="//" if verdict_name == "robust" else None, color=f"C{i % len(metrics)}",
               edgecolor="white")
    for x, row in enumerate(summary):  # a level without a bar says why
        if not any(row.get(f"{protocol}.{v}.{m}") for m, v in bars):
            ax.text(x, 52, empty_reason(row), ha="center", va="center", fontsize=8,
                    color="#8a2a0a")
    if not summary:
        ax.text(0.5, 0.5, "no task was scored", ha="center", va="center", transform=ax.transAxes,
                color="#8a2a0a")
    ax.set_xticks(range(len(levels)), [f"level {lv}" if lv != "all" else "all" for lv in levels])
    ax.set_ylabel("% of tasks")
    ax.set_ylim(0, 105)
    ax.set_title(f"{title} ({protocol} tolerances)")
    ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.1))
    _save(plt, fig, path)


def plot_speedups(records: Sequence[Mapping], protocol: Protocol, path: Path, title: str) -> None:
    """Point speedups of correct kernels (plain verdict) per level, launch-bound tasks marked."""
    plt, (fig, ax) = _figure(7, 3.8)
    points = [(r["level"], r["result"]["speedup_median"], bool(r["result"].get("launch_bound")))
              for r in records if r["reference_ok"] and r.get("result")
              and verdict(r["result"], protocol=protocol, robust=False)
              and r["result"].get("speedup_median")]
    for launch_bound, marker, label in ((False, "o", "reference above the launch-bound floor"),
                                        (True, "x", "launch-bound reference")):
        chosen = [(lv, s) for lv, s, lb in points if lb == launch_bound]
        offsets = [((i * 0.618) % 1 - 0.5) * 0.5 for i in range(len(chosen))]  # fixed jitter
        ax.scatter([lv + o for (lv, _), o in zip(chosen, offsets)], [s for _, s in chosen],
                   marker=marker, label=f"{label} ({len(chosen)})", alpha=0.8)
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_yscale("log")
    if not points:
        ax.set_ylim(0.1, 10)
        usable = [r for r in records if r.get("reference_ok")]
        code = sum(1 for r in usable if r.get("has_code"))
        compiled = sum(1 for r in usable if r.get("result") and r["result"].get("compiled"))
        reason = ("no task was scored" if not usable else
                  f"no code written (0 of {len(usable)} kernels)" if not code else
                  f"{code} of {len(usable)} kernels written, none compiled" if not compiled else
                  f"{compiled} of {len(usable)} kernels compiled, none correct under "
                  f"{protocol.name}")
        ax.text(0.5, 0.7, f"no correct kernel to plot:\n{reason}", ha="center", va="center",
                transform=ax.transAxes, fontsize=9, color="#8a2a0a")
    times = plt.FuncFormatter(lambda value, _: f"{value:g}x")
    ax.yaxis.set_major_formatter(times)
    ax.yaxis.set_minor_formatter(times)
    ax.tick_params(axis="y", which="minor", labelsize=7)
    ax.set_xticks([1, 2, 3], ["level 1", "level 2", "level 3"])
    ax.set_ylabel("speedup over PyTorch eager (median)")
    ax.set_title(f"{title}: {len(points)} correct kernels")
    ax.legend(fontsize=7)
    _save(plt, fig, path)


COMPARE_LABELS = ("source", "system", "paper_system", "size", "protocol", "level")


def _level_rank(level: str) -> tuple[int, int]:
    return (0, int(level)) if str(level).isdigit() else (1, 0)


def compare_rows(summaries: Mapping[str, Sequence[Mapping]], protocols: Sequence[str],
                 literature: Sequence[Mapping] = (),
                 paper_systems: Mapping[str, str] | None = None) -> tuple[list[dict], list[str]]:
    """The compare table: per level (then `all`), the run's systems in order (the model, then
    its baselines), then the paper's rows in its table order. Run rows are labelled
    source `run`, the protocols their columns report and the paper's name for the system
    (`paper_systems`: system -> the row of the paper's table it is, "" if none); literature
    rows carry their own labels and fill only the columns the paper reports. Returns (rows,
    columns)."""
    paper_systems = paper_systems or {}
    run_label = {"source": "run", "size": "", "protocol": ";".join(protocols)}
    run = [{**run_label, "paper_system": paper_systems.get(name, ""), **row}
           for name in summaries for row in summaries[name]]
    literature = [{"paper_system": row["system"], **row} for row in literature]
    order = {name: i for i, name in enumerate(summaries)}
    keyed = [((_level_rank(r["level"]), 0, order[r["system"]]), r) for r in run]
    keyed += [((_level_rank(r["level"]), 1, i), r) for i, r in enumerate(literature)]
    rows = [row for _, row in sorted(keyed, key=lambda item: item[0])]
    columns = list(COMPARE_LABELS)
    for row in run + list(literature):
        columns += [c for c in row if c not in columns]
    return rows, columns


def plot_compare(rows: Sequence[Mapping], protocol: str, fast_p: Sequence[float], path: Path,
                 title: str) -> None:
    """Per level, a bar per system: Exec with fast_p nested inside it (point speedups, plain
    verdict, `protocol`). The paper's rows are hatched and marked "(paper)" below the run's."""
    from matplotlib.patches import Patch

    from .metrics import p_label

    metrics = ["exec"] + [f"fast_{p_label(p)}_point" for p in fast_p]
    levels = sorted({r["level"] for r in rows}, key=_level_rank)
    systems = list(dict.fromkeys((r["source"], r["system"], r["size"]) for r in rows))
    values = {(r["source"], r["system"], r["size"], r["level"]): r for r in rows}
    shown = [100 * float(r[c]) for r in rows for c in (f"{protocol}.plain.{m}" for m in metrics)
             if r.get(c) not in (None, "")]
    top = min(100, max(10, 10 * math.ceil(1.1 * max(shown, default=0) / 10)))
    runs = sum(source == "run" for source, _, _ in systems)
    plt, (fig, axes) = _figure(3 * len(levels) + 2.5, 0.24 * len(systems) + 1.8, ncols=len(levels),
                               sharey=True, squeeze=False)
    for ax, level in zip(axes[0], levels):
        for y, system in enumerate(systems):
            row = values.get((*system, level))
            paper = system[0] != "run"
            shares = [_share(row.get(f"{protocol}.plain.{m}")) for m in metrics] if row else []
            if row and not paper and not any(shares):
                # a run row without a bar: say why beside its zero
                ax.text(0.01 * top, y, "0: " + empty_reason(row).replace("\n", " "),
                        va="center", fontsize=6, color="#8a2a0a")
            for i, metric in enumerate(metrics):
                value = row.get(f"{protocol}.plain.{metric}") if row else None
                if value is None or value == "":
                    continue
                ax.barh(y, 100 * float(value), 0.8 * (1 - i / (len(metrics) + 0.5)),
                        color=f"C{i}", hatch="///" if paper else None,
                        alpha=0.6 if paper else 1.0, edgecolor="white", linewidth=0)
        ax.set_title(f"level {level}" if level != "all" else "all")
        ax.set_xlim(0, top)
        ax.set_xlabel("% of tasks")
        ax.grid(axis="x", linewidth=0.3)
        if 0 < runs < len(systems):
            ax.axhline(runs - 0.5, color="black", linewidth=0.6)
    names = [f"{name} ({size}, paper)" if source != "run" else f"{name} (this run)"
             for source, name, size in systems]
    axes[0][0].set_yticks(range(len(systems)), names, fontsize=7)
    for label, (source, _, _) in zip(axes[0][0].get_yticklabels(), systems):
        label.set_fontweight("bold" if source == "run" else "normal")
    axes[0][0].invert_yaxis()
    sources = sorted({s for s, _, _ in systems if s != "run"})
    handles = [Patch(color=f"C{i}", label=m) for i, m in enumerate(metrics)]
    handles += [Patch(facecolor="grey", label="this run")]
    handles += [Patch(facecolor="grey", alpha=0.6, hatch="///", label=s) for s in sources]
    fig.legend(handles=handles, fontsize=7, ncol=len(handles), loc="lower center")
    fig.suptitle(f"{title} ({protocol}, plain verdict, point speedups)")
    fig.tight_layout(rect=(0, 0.4 / fig.get_figheight(), 1, 1))  # room for the legend
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, metadata={"Software": None})
    plt.close(fig)
