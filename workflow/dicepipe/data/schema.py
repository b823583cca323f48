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
        # curriculum: the source's level, else data/assemble.estimate_level of the reference
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
    return check_table(read_parquet(path), schema, path)


def read_parquet(path: str | Path) -> pa.Table:
    """The table at `path`; a file pyarrow cannot read (cut short, not Parquet) is a
    StageInputError naming the file, the stage that writes it and the command that does."""
    try:
        return pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        if isinstance(exc, FileNotFoundError):
            raise StageInputError(f"{path}: no such file.") from exc
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise StageInputError(f"{path}: not a readable Parquet file ({reason}); it was cut "
                              f"short or overwritten. {remake_command(path)}") from exc


# The pipeline's DVC files: the default chain, then the real scales (addressed through it).
DVC_FILES = ("dvc.yaml", "real/dvc.yaml")


def remake_command(path: str | Path, dvc_files=DVC_FILES) -> str:
    """How to write `path` again: its stage under both runners (found from the DVC files'
    outs, read from the working directory, the repository root under both), else a generic
    hint. A stage of a file other than ./dvc.yaml is addressed through it
    (`real/dvc.yaml:sft@8b`).

    Neither runner re-runs the producer by itself under `snakemake`: Snakemake goes by times
    (the file is older than nothing), so the command forces it."""
    stage = None
    for n, dvc_file in enumerate((dvc_files,) if isinstance(dvc_files, (str, Path)) else dvc_files):
        found = producing_stage(path, dvc_file)
        if found is not None:
            stage = found if n == 0 else f"{Path(dvc_file).as_posix()}:{found}"
            break
    if stage is None:
        return ("Re-create it (no stage in dvc.yaml writes it: restore it from where it came "
                "from).")
    return (f"Stage {stage} writes it; run it again: `snakemake --cores 2 --forcerun {path}` "
            f"(then `snakemake --cores 2` for the stages after it) or "
            f"`dvc repro --force --single-item {stage} && dvc repro`.")


def producing_stage(path: str | Path, dvc_file: str | Path = "dvc.yaml") -> str | None:
    """The DVC stage (`name` or `name@key`) whose outs hold `path`: each out's ${...}
    placeholders matched against the path (foreach keys by `${key}`, matrix keys in order)."""
    import re

    import yaml

    try:
        stages = yaml.safe_load(Path(dvc_file).read_text())["stages"]
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return None
    wanted = Path(path).as_posix()
    if Path(path).is_absolute():
        try:
            wanted = Path(path).resolve().relative_to(Path.cwd().resolve()).as_posix()
        except ValueError:
            return None
    for name, spec in stages.items():
        body = spec.get("do", spec) if isinstance(spec, dict) else {}
        for out in body.get("outs", []) or []:
            out = next(iter(out)) if isinstance(out, dict) else str(out)
            names = re.findall(r"\$\{([^}]+)\}", out)
            pattern = "([^/]+)".join(re.escape(part) for part in re.split(r"\$\{[^}]+\}", out))
            # an out that is a folder holds every file below it
            match = re.fullmatch(pattern + r"(?:/.*)?", wanted)
            if not match:
                continue
            values = dict(zip(names, match.groups()))
            if "matrix" in spec:
                keys = [values.get(f"item.{k}", "") for k in spec["matrix"]]
                if all(_allowed(keys[i], ref) for i, ref in enumerate(spec["matrix"].values())):
                    return f"{name}@{'-'.join(keys)}"
            elif "foreach" in spec:
                if _allowed(values.get("key", ""), spec["foreach"]):
                    return f"{name}@{values.get('key', '')}"
            else:
                return name
    return None


def _allowed(value: str, ref, params_file: str | Path = "params.yaml") -> bool:
    """Whether `value` is one of a foreach/matrix's keys (`${corpora}`: params.yaml's
    corpora), so results/kernelbench_compare_tiny.csv is not evaluate@compare_tiny's."""
    import re

    import yaml

    match = re.fullmatch(r"\$\{([^}]+)\}", str(ref))
    try:
        node = yaml.safe_load(Path(params_file).read_text()) if match else ref
        for part in match.group(1).split(".") if match else []:
            node = node[part]
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return True  # cannot tell: the file name decides
    return value in [str(k) for k in node] if isinstance(node, (dict, list)) else True


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
