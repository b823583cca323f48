"""Benchmark suites as rows of BENCHMARK_SCHEMA, from the three KernelBench layouts:
a local checkout (`level1/<id>_<Name>.py`, ...), a Parquet with the published dataset's
columns (level, problem_id, name, code), or the dataset id on the hub (splits level_1...)."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa

from ..errors import SourceError
from .schema import BENCHMARK_SCHEMA

_TASK_FILE = re.compile(r"^(\d+)_(.+)\.py$")


def _row(level: int, problem_id: int, name: str, code: str) -> dict:
    return {"task_id": f"L{level}/{name}", "level": int(level), "problem_id": int(problem_id),
            "name": name, "reference_code": code}


def _from_dir(path: Path, levels) -> list[dict]:
    if not path.is_dir():
        raise SourceError(f"{path}: no such benchmark folder. Expected level1/, level2/, ... inside.")
    rows = []
    for level in levels:
        folder = path / f"level{level}"
        for file in sorted(folder.glob("*.py")) if folder.is_dir() else []:
            match = _TASK_FILE.match(file.name)
            if not match:
                raise SourceError(f"{file}: benchmark files are named <id>_<Name>.py.")
            rows.append(_row(level, int(match.group(1)), file.name[:-3], file.read_text()))
    return rows


def _from_parquet(path: Path, levels) -> list[dict]:
    import pyarrow.parquet as pq

    if not path.is_file():
        raise SourceError(f"{path}: no such benchmark parquet.")
    table = pq.read_table(path)
    missing = {"level", "problem_id", "name", "code"} - set(table.column_names)
    if missing:
        raise SourceError(f"{path}: missing columns {sorted(missing)} (KernelBench dataset layout).")
    return [_row(r["level"], r["problem_id"], r["name"], r["code"])
            for r in table.to_pylist() if r["level"] in levels]


def _from_hub(dataset_id: str, levels) -> list[dict]:
    import datasets

    rows = []
    for level in levels:
        try:
            split = datasets.load_dataset(dataset_id, split=f"level_{level}")
        except Exception as exc:
            raise SourceError(f"cannot load {dataset_id!r} split level_{level}: {exc}. Download it "
                              "and point the benchmark at a local parquet or checkout.") from exc
        rows += [_row(level, r["problem_id"], r["name"], r["code"]) for r in split]
    return rows


def load_benchmark(spec: dict, base_dir: Path = Path(".")) -> pa.Table:
    levels = spec.get("levels", [1, 2, 3])
    kind = spec["kind"]
    if kind == "kernelbench_dir":
        rows = _from_dir(base_dir / spec["path"], levels)
    elif kind == "parquet":
        rows = _from_parquet(base_dir / spec["path"], levels)
    else:
        rows = _from_hub(spec["path"], levels)
    rows.sort(key=lambda r: (r["level"], r["problem_id"], r["name"]))
    return pa.Table.from_pylist(rows, schema=BENCHMARK_SCHEMA)
