"""Corpus sources: each yields raw records with our field names (or None where absent).

Field names: task_name, level, reference, candidate, prompt, response, reasoning,
reported_speedup. A record carries either (reference, candidate) code directly or a
(prompt, response) pair from which `dicepipe.stages.ingest` extracts the code.
The `columns` mapping in params.yaml renames a source's columns onto these fields.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import yaml

from ..errors import SourceError

FIELDS = ("task_name", "level", "reference", "candidate", "prompt", "response", "reasoning",
          "reported_speedup")

# Default column names per source kind; params.yaml `columns` overrides them per field.
DEFAULT_COLUMNS = {
    "hub": {f: f for f in FIELDS},
    "parquet": {f: f for f in FIELDS},
    "jsonl": {f: f for f in FIELDS},
    "json": {f: f for f in FIELDS},
    "sft_json": {"prompt": "prompt", "response": "response"},
    # ByteDance-Seed/cudaLLM-data: verl SFT files use prompts/responses, RL files prompt/answer.
    "cudallm_parquet": {"prompt": "prompts", "response": "responses", "reference": "py_code"},
}


def iter_records(source: dict, base_dir: Path = Path(".")) -> Iterator[dict]:
    kind = source["kind"]
    readers = {
        "pairs_dir": _read_pairs_dir,
        "hub": _read_hub,
        "parquet": _read_parquet,
        "cudallm_parquet": _read_parquet,
        "jsonl": _read_jsonl,
        "json": _read_json,
        "sft_json": _read_json,
    }
    columns = {**DEFAULT_COLUMNS.get(kind, {}), **source.get("columns", {})}
    unknown = sorted(set(source.get("columns", {})) - set(FIELDS))
    if unknown:
        raise SourceError(
            f"source columns {unknown} are not fields we know. Expected keys among {list(FIELDS)}."
        )
    if kind == "pairs_dir":
        yield from _read_pairs_dir(_local(source, base_dir))
        return
    rows = readers[kind](source, base_dir)
    for row in rows:
        yield _map_columns(row, columns, kind)


def _local(source: dict, base_dir: Path) -> Path:
    path = base_dir / source["path"]
    if not path.exists():
        raise SourceError(
            f"source path {source['path']!r} does not exist (kind {source['kind']}). Put the "
            "file there or point the corpus's source.path in params.yaml at it."
        )
    return path


def _map_columns(row: dict, columns: dict, kind: str) -> dict:
    if "__malformed__" in row:
        return row
    record = {f: None for f in FIELDS}
    for field, column in columns.items():
        # cudaLLM names differ between its files: accept the singular/plural twin too.
        for name in (column, column.rstrip("s"), column + "s") if kind == "cudallm_parquet" else (column,):
            if name in row and row[name] is not None:
                record[field] = row[name]
                break
    record["prompt"] = _chat_text(record["prompt"], "user")
    record["response"] = _chat_text(record["response"], "assistant")
    return record


def _chat_text(value, role: str):
    """verl-style files store chat turns as a list of {role, content}; take the turn's text."""
    if isinstance(value, list):
        texts = [m.get("content", "") for m in value if isinstance(m, dict) and m.get("role") == role]
        if not texts and value and isinstance(value[-1], dict):
            texts = [value[-1].get("content", "")]
        return "\n".join(t for t in texts if t) or None
    if isinstance(value, dict) and "content" in value:
        return value["content"]
    return value


def _read_pairs_dir(path: Path) -> Iterator[dict]:
    ref_dir, cand_dir = path / "reference", path / "kernels"
    if not ref_dir.is_dir() or not cand_dir.is_dir():
        raise SourceError(
            f"{path}: a pairs_dir source needs the folders reference/ and kernels/ with "
            "matching file names."
        )
    meta_path = path / "meta.yaml"
    meta = yaml.safe_load(meta_path.read_text()) if meta_path.is_file() else {}
    names = sorted({p.name for p in ref_dir.glob("*.py")} | {p.name for p in cand_dir.glob("*.py")})
    for name in names:
        stem = name[:-3]
        ref, cand = ref_dir / name, cand_dir / name
        info = (meta or {}).get(stem) or {}
        yield {
            "task_name": stem,
            "level": info.get("level"),
            "reference": ref.read_text() if ref.is_file() else None,
            "candidate": cand.read_text() if cand.is_file() else None,
            "prompt": None,
            "response": None,
            "reasoning": None,
            "reported_speedup": info.get("reported_speedup"),
        }


def _read_hub(source: dict, base_dir: Path) -> Iterator[dict]:
    del base_dir
    import datasets

    try:
        dataset = datasets.load_dataset(source["path"], split=source.get("split", "train"))
    except Exception as exc:  # datasets raises many types (network, missing split, ...)
        raise SourceError(
            f"cannot load dataset {source['path']!r} split {source.get('split', 'train')!r}: {exc}. "
            "Check the id and split, or download it and use a local parquet source."
        ) from exc
    yield from dataset


def _read_parquet(source: dict, base_dir: Path) -> Iterator[dict]:
    import pyarrow.parquet as pq

    path = _local(source, base_dir)
    try:
        parquet = pq.ParquetFile(path)
    except Exception as exc:
        raise SourceError(f"{path}: not a readable parquet file: {exc}") from exc
    for batch in parquet.iter_batches(batch_size=256):
        yield from batch.to_pylist()


def _read_jsonl(source: dict, base_dir: Path) -> Iterator[dict]:
    path = _local(source, base_dir)
    with open(path) as fh:
        for line_no, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                yield {"__malformed__": f"line {line_no}"}
                continue
            yield row if isinstance(row, dict) else {"__malformed__": f"line {line_no}"}


def _read_json(source: dict, base_dir: Path) -> Iterator[dict]:
    path = _local(source, base_dir)
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise SourceError(f"{path}: not valid JSON ({exc}). Expected a list of objects.") from exc
    if isinstance(data, dict):
        # {"data": [...]} or {id: row} layouts
        data = data.get("data", list(data.values()))
    if not isinstance(data, list):
        raise SourceError(f"{path}: expected a JSON list of objects, got {type(data).__name__}.")
    for row in data:
        yield row if isinstance(row, dict) else {"__malformed__": repr(row)[:40]}
