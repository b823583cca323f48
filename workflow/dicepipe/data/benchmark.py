"""Benchmark suites as rows of BENCHMARK_SCHEMA, from the three KernelBench layouts:
a local checkout (`level1/<id>_<Name>.py`, ...), a Parquet with the published dataset's
columns (level, problem_id, name, code), or the dataset id on the hub (splits level_1...).

A spec (params.yaml `benchmarks.<name>`) also picks levels and optionally a task subset,
and names the version (a KernelBench commit or dataset revision) that every row records.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa

from ..errors import SourceError
from .schema import BENCHMARK_SCHEMA

_TASK_FILE = re.compile(r"^(\d+)_(.+)\.py$")
UNVERSIONED = "unversioned"


def _row(level: int, problem_id: int, name: str, code: str, version: str) -> dict:
    return {"task_id": f"L{level}/{name}", "level": int(level), "problem_id": int(problem_id),
            "name": name, "reference_code": code, "version": version}


def _from_dir(path: Path, levels, version: str) -> list[dict]:
    if not path.is_dir():
        raise SourceError(f"{path}: no such benchmark folder. Expected level1/, level2/, ... inside.")
    rows = []
    for level in levels:
        folder = path / f"level{level}"
        for file in sorted(folder.glob("*.py")) if folder.is_dir() else []:
            match = _TASK_FILE.match(file.name)
            if not match:
                raise SourceError(f"{file}: benchmark files are named <id>_<Name>.py.")
            rows.append(_row(level, int(match.group(1)), file.name[:-3], file.read_text(), version))
    return rows


def _from_parquet(path: Path, levels, version: str) -> list[dict]:
    import pyarrow.parquet as pq

    if not path.is_file():
        raise SourceError(f"{path}: no such benchmark parquet.")
    table = pq.read_table(path)
    missing = {"level", "problem_id", "name", "code"} - set(table.column_names)
    if missing:
        raise SourceError(f"{path}: missing columns {sorted(missing)} (KernelBench dataset layout: "
                          "level, problem_id, name, code).")
    return [_row(r["level"], r["problem_id"], r["name"], r["code"], version)
            for r in table.to_pylist() if r["level"] in levels]


def _from_hub(dataset_id: str, levels, version: str, revision: str | None) -> list[dict]:
    import datasets

    rows = []
    for level in levels:
        try:
            split = datasets.load_dataset(dataset_id, split=f"level_{level}", revision=revision)
        except Exception as exc:
            raise SourceError(f"cannot load {dataset_id!r} split level_{level}: {exc}. Download it "
                              "and point the benchmark at a local parquet or checkout.") from exc
        rows += [_row(level, r["problem_id"], r["name"], r["code"], version) for r in split]
    return rows


def select_tasks(rows: list[dict], wanted: Iterable[str] | None, source: str) -> list[dict]:
    """Keep the rows a task subset names; a name is a task id (`L1/19_ReLU`), a file name
    (`19_ReLU`) or level and problem id (`L1/19`). Every name must match a row."""
    if not wanted:
        return rows
    wanted = list(wanted)
    keys = {}
    for row in rows:
        for key in (row["task_id"], row["name"], f"L{row['level']}/{row['problem_id']}"):
            keys.setdefault(key, []).append(row["task_id"])
    unknown = [w for w in wanted if w not in keys]
    if unknown:
        raise SourceError(f"{source}: tasks {unknown[:5]} name no task of the chosen levels. Use a "
                          "task id (L1/19_ReLU), a file name (19_ReLU) or L<level>/<problem id>.")
    chosen = {task_id for w in wanted for task_id in keys[w]}
    return [row for row in rows if row["task_id"] in chosen]


def load_benchmark(spec: dict, base_dir: Path = Path("."), source: str = "benchmark") -> pa.Table:
    """The rows of a `benchmarks.<name>` spec, sorted by level and problem id."""
    levels = spec.get("levels", [1, 2, 3])
    version = str(spec.get("version") or UNVERSIONED)
    kind = spec["kind"]
    if kind == "kernelbench_dir":
        rows = _from_dir(base_dir / spec["path"], levels, version)
    elif kind == "parquet":
        rows = _from_parquet(base_dir / spec["path"], levels, version)
    elif kind == "hub":
        rows = _from_hub(spec["path"], levels, version, spec.get("revision"))
    else:
        raise SourceError(f"{source}: kind {kind!r} is not one of kernelbench_dir, parquet, hub.")
    if not rows:
        raise SourceError(f"{source}: no tasks at levels {levels} in {spec['path']}.")
    rows = select_tasks(rows, spec.get("tasks"), source)
    ids = [row["task_id"] for row in rows]
    if len(set(ids)) != len(ids):
        raise SourceError(f"{source}: task ids repeat in {spec['path']}: "
                          f"{sorted({i for i in ids if ids.count(i) > 1})[:5]}.")
    rows.sort(key=lambda r: (r["level"], r["problem_id"], r["name"]))
    return pa.Table.from_pylist(rows, schema=BENCHMARK_SCHEMA)


def reference_copy(reference_code: str) -> str:
    """A kernel file whose ModelNew is a textual copy of the reference's Model (every `Model`
    word renamed, so `super(Model, self)` follows): correct by construction, no kernel of its
    own. Evaluation runs it to tell a broken reference from a wrong candidate."""
    return re.sub(r"\bModel\b", "ModelNew", reference_code)
