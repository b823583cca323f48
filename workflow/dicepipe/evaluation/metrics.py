"""KernelBench metrics from per-sample records (pure functions).

A record is one generated (or supplied) kernel for one task: the task's fields, `sample`,
`reference_ok` (the task's reference ran and agreed with a copy of itself) and `result` (the
harness row, or None when there was no code to run). Every decision goes through
`dicepipe.judgement`, under each tolerance protocol and under the plain and the robust verdict:

- exec: compiled and correct (KernelBench's correctness rate), averaged over a task's
  samples, then over tasks;
- fast_{p}_point: correct and point speedup (ratio of medians) > p, as the paper and
  KernelBench's `fastp` compute it (strict);
- fast_{p}_interval: correct and the lower end of the speedup interval > p (the harness's
  "faster with confidence");
- geomean_speedup: geometric mean of the point speedup over correct kernels;
- pass_at_{k}: the unbiased estimator 1 - C(n-c, k) / C(n, k) per task (n samples, c
  correct), averaged over tasks, for k <= n;
- launch_bound_share: of the tasks with a correct kernel, the share whose reference runs
  under the harness's launch-bound floor (their speedups are mostly launch overhead).

Tasks whose reference fails are counted in `reference_failed` and left out of every
denominator: they say nothing about the model. A task whose reference runs but does not
agree with a copy of itself under a protocol (nondeterministic at 1e-4, say, or changing
with the input distribution under the strict check) is counted in
`<protocol>.reference_limited` and left out of that protocol's denominators only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from itertools import groupby

from ..judgement import Protocol, verdict

VERDICTS = (("plain", False), ("robust", True))


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one task: n samples of which c are correct (Chen et al. 2021)."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def p_label(p: float) -> str:
    return f"{p:g}"


def metric_names(fast_p: Sequence[float], pass_k: Sequence[int]) -> list[str]:
    names = ["exec"]
    for p in fast_p:
        names += [f"fast_{p_label(p)}_point", f"fast_{p_label(p)}_interval"]
    names += ["geomean_speedup", "launch_bound_share"]
    names += [f"pass_at_{k}" for k in pass_k]
    return names


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _geomean(values: Sequence[float]) -> float | None:
    values = [v for v in values if v is not None and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def _task_scores(samples: Sequence[Mapping], protocol: Protocol, robust: bool,
                 fast_p: Sequence[float]) -> dict:
    """Per task: share of correct / fast samples, correct count, correct speedups."""
    rows = [s.get("result") for s in samples]
    correct = [verdict(r, protocol=protocol, robust=robust) for r in rows]
    out = {"correct": sum(correct), "n": len(rows), "exec": sum(correct) / len(rows),
           "speedups": [r["speedup_median"] for r, ok in zip(rows, correct) if ok],
           "launch_bound": any(bool(r and r.get("launch_bound")) for r in rows)}
    for p in fast_p:
        for label, statistic in (("point", "median"), ("interval", "low")):
            fast = [verdict(r, protocol=protocol, robust=robust, threshold=p, statistic=statistic)
                    for r in rows]
            out[f"fast_{p_label(p)}_{label}"] = sum(fast) / len(rows)
    return out


def reference_usable(record: Mapping, protocol: Protocol) -> bool:
    """The task's reference ran and agreed with a copy of itself under `protocol` (a
    reference that only agrees with itself at 1e-3, nondeterministic atomics say, cannot
    judge candidates at 1e-4; one that disagrees with itself on varied inputs cannot be
    judged by the strict check: under that protocol the task is reference-limited)."""
    if not record["reference_ok"]:
        return False
    check = record.get("reference_check")
    if not check:
        return True
    return protocol.is_correct(check)


def score_group(records: Sequence[Mapping], protocol: Protocol, robust: bool,
                fast_p: Sequence[float], pass_k: Sequence[int]) -> dict:
    """The metrics of one group of tasks (a level, or all) under one verdict."""
    by_task = _by_task(r for r in records if reference_usable(r, protocol))
    tasks = [_task_scores(samples, protocol, robust, fast_p) for samples in by_task.values()]
    out: dict = {"exec": _mean([t["exec"] for t in tasks])}
    for p in fast_p:
        for label in ("point", "interval"):
            key = f"fast_{p_label(p)}_{label}"
            out[key] = _mean([t[key] for t in tasks])
    out["geomean_speedup"] = _geomean([s for t in tasks for s in t["speedups"]])
    solved = [t for t in tasks if t["correct"]]
    out["launch_bound_share"] = _mean([float(t["launch_bound"]) for t in solved])
    for k in pass_k:
        values = [pass_at_k(t["n"], t["correct"], k) for t in tasks if t["n"] >= k]
        out[f"pass_at_{k}"] = _mean(values) if len(values) == len(tasks) else None
    return out


def _by_task(records: Iterable[Mapping]) -> dict[str, list[Mapping]]:
    out: dict[str, list[Mapping]] = {}
    for record in records:
        out.setdefault(record["task_id"], []).append(record)
    return out


def summarize(records: Sequence[Mapping], system: str, protocols: Sequence[Protocol],
              fast_p: Sequence[float], pass_k: Sequence[int]) -> list[dict]:
    """One row per level and one for `all`: counts, then `<protocol>.<plain|robust>.<metric>`."""
    rows = []
    ordered = sorted(records, key=lambda r: r["level"])
    groups = [(str(level), list(group)) for level, group in groupby(ordered, key=lambda r: r["level"])]
    for level, group in groups + [("all", list(ordered))]:
        tasks = _by_task(group)
        ok = {t for t, samples in tasks.items() if samples[0]["reference_ok"]}
        row = {"system": system, "level": level, "tasks": len(ok),
               "reference_failed": len(tasks) - len(ok),
               "samples_per_task": max((len(s) for s in tasks.values()), default=0),
               "with_code": _mean([float(r.get("has_code", False)) for r in group
                                   if r["task_id"] in ok]),
               "compiled": _mean([float(bool(r.get("result") and r["result"].get("compiled")))
                                  for r in group if r["task_id"] in ok])}
        for protocol in protocols:
            usable = {r["task_id"] for r in group if reference_usable(r, protocol)}
            # ran, but does not agree with a copy of itself under this protocol: the task
            # is reference-limited here, out of this protocol's denominators only
            row[f"{protocol.name}.reference_limited"] = len(ok) - len(usable & ok)
            for verdict_name, robust in VERDICTS:
                scores = score_group(group, protocol, robust, fast_p, pass_k)
                for name in metric_names(fast_p, pass_k):
                    row[f"{protocol.name}.{verdict_name}.{name}"] = _round(scores[name])
        row["with_code"], row["compiled"] = _round(row["with_code"]), _round(row["compiled"])
        rows.append(row)
    return rows


def _round(value):
    return None if value is None else round(float(value), 6)


def headline(row: Mapping, protocol: str, verdict_name: str, fast_p: Sequence[float]) -> str:
    """`Exec fast_1/fast_2` in percent, the paper's cell format (point speedups)."""
    def pct(name):
        value = row.get(f"{protocol}.{verdict_name}.{name}")
        return "-" if value is None else f"{100 * value:.0f}"

    fast = "/".join(pct(f"fast_{p_label(p)}_point") for p in fast_p)
    return f"{pct('exec')} {fast}"
