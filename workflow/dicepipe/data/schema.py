"""Arrow schemas of the pipeline's tables, declared once and imported wherever rows are
read or written. `check_table` turns a mismatch into a StageInputError naming the file."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import StageInputError

# One normalised corpus sample (ingest output; also the shape of benchmark tasks).
SAMPLE_SCHEMA = pa.schema(
    [
        pa.field("sample_id", pa.string(), nullable=False),  # content hash of reference+candidate
        pa.field("source", pa.string(), nullable=False),  # corpus source name
        pa.field("task_name", pa.string(), nullable=False),
        pa.field("level", pa.int32()),
        pa.field("backend", pa.string(), nullable=False),  # cpu | cuda
        pa.field("reference_code", pa.string(), nullable=False),  # PyTorch program (class Model)
        pa.field("candidate_code", pa.string(), nullable=False),  # full kernel file (class ModelNew)
        pa.field("reasoning", pa.string()),
        pa.field("reported_speedup", pa.float64()),
        # the source's own user turn, verbatim (CuKe's `prompt`); SFT trains on it. Null when
        # the source carries none (pairs, generated kernels): the project's prompt is used.
        pa.field("prompt", pa.string()),
    ]
)

# A benchmark task (evaluation input): KernelBench layout as data.
BENCHMARK_SCHEMA = pa.schema(
    [
        pa.field("task_id", pa.string(), nullable=False),  # "L{level}/{name}"
        pa.field("level", pa.int32(), nullable=False),
        pa.field("problem_id", pa.int32(), nullable=False),
        pa.field("name", pa.string(), nullable=False),
        pa.field("reference_code", pa.string(), nullable=False),
        # the benchmark's version as params.yaml names it (a KernelBench commit, a dataset
        # revision), the same in every row
        pa.field("version", pa.string(), nullable=False),
    ]
)

# Assembled CuKe splits.
SFT_SCHEMA = pa.schema(
    [
        pa.field("sample_id", pa.string(), nullable=False),
        pa.field("origin", pa.string(), nullable=False),  # corpus | structural
        pa.field("level", pa.int32()),
        pa.field("prompt", pa.string(), nullable=False),  # user turn (instruction + reference)
        pa.field("response", pa.string(), nullable=False),  # assistant turn (fenced kernel file)
    ]
)

RL_INFILL_SCHEMA = pa.schema(
    [
        pa.field("sample_id", pa.string(), nullable=False),
        # curriculum: the source's level, else data/cuke.estimate_level of the reference
        pa.field("level", pa.int32(), nullable=False),
        pa.field("reference_code", pa.string(), nullable=False),
        pa.field("candidate_code", pa.string(), nullable=False),
        pa.field("prefix", pa.string(), nullable=False),
        pa.field("core", pa.string(), nullable=False),
        pa.field("suffix", pa.string(), nullable=False),
        pa.field("prompt", pa.string(), nullable=False),
    ]
)

RL_E2E_SCHEMA = pa.schema(
    [
        pa.field("sample_id", pa.string(), nullable=False),
        pa.field("level", pa.int32(), nullable=False),  # difficulty for curriculum ordering
        pa.field("reference_code", pa.string(), nullable=False),
        pa.field("prompt", pa.string(), nullable=False),
    ]
)

# Held-out references for RL model selection: the end-to-end prompt (stage 2) and the
# infilling prompt of the held-out solution (stage 1; null when it has no kernel-source
# assignment to cut out).
VAL_SCHEMA = pa.schema([*RL_E2E_SCHEMA, pa.field("infill_prompt", pa.string())])


def check_table(table: pa.Table, schema: pa.Schema, path: str | Path) -> pa.Table:
    """Check that `table` has exactly `schema`'s columns and types; return it cast to it."""
    missing = [f.name for f in schema if f.name not in table.column_names]
    if missing:
        raise StageInputError(
            f"{path}: missing columns {missing}. Expected the columns {schema.names}; "
            "re-run the stage that writes this file."
        )
    table = table.select(schema.names)
    try:
        table = table.cast(schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise StageInputError(f"{path}: columns do not match the expected types: {exc}") from exc
    for field in schema:
        if not field.nullable and table.column(field.name).null_count:
            raise StageInputError(f"{path}: column '{field.name}' has null values; it may not.")
    return table


def read_table(path: str | Path, schema: pa.Schema) -> pa.Table:
    path = Path(path)
    if not path.is_file():
        raise StageInputError(f"{path}: no such file. Run the stage that produces it first.")
    return check_table(pq.read_table(path), schema, path)


def write_table(table: pa.Table, path: str | Path, schema: pa.Schema | None = None) -> None:
    """Write deterministically: fixed schema, no pandas metadata, atomic rename."""
    path = Path(path)
    if schema is not None:
        table = check_table(table, schema, path)
    table = table.replace_schema_metadata(None)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(table, tmp, compression="zstd", use_dictionary=False, write_statistics=False)
    tmp.replace(path)


def empty_table(schema: pa.Schema) -> pa.Table:
    return schema.empty_table()
