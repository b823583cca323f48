"""Every ingest source format, each with malformed rows that are counted, never silent."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dicepipe.data import extract
from dicepipe.data.sources import iter_records
from dicepipe.errors import SourceError
from dicepipe.stages.ingest import ingest_records

REFERENCE = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(64, 64)]


def get_init_inputs():
    return []
'''

CANDIDATE = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = r"""
#include <torch/extension.h>
torch::Tensor relu_op(torch::Tensor x) { return x.clamp_min(0); }
"""

ext = load_inline(name="relu_ext", cpp_sources=source, functions=["relu_op"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return ext.relu_op(x)
'''

SETTINGS = {"min_code_chars": 40, "code_block": "first"}


def _prompt(reference: str) -> str:
    example = "class Model(nn.Module):\n    pass\n"
    example_new = "class ModelNew(nn.Module):\n    pass\n"
    return (f"Example:\n```python\n{example}```\n```python\n{example_new}```\n"
            f"Optimise this:\n```python\n{reference}```\nAnswer in code.")


def _response(candidate: str) -> str:
    return f"<think>use a clamp</think>\nHere it is:\n```python\n{candidate}```\n```python\nprint(1)\n```"


def _ingest(source, tmp_path):
    rows, report = ingest_records(iter_records(source, tmp_path), source="t", backend="cpu",
                                  settings=SETTINGS)
    return rows, report


def _check_one_kept(rows, report, dropped):
    assert len(rows) == 1
    row = rows[0]
    assert row["sample_id"] == extract.sample_id(REFERENCE, CANDIDATE)
    assert "class ModelNew" in row["candidate_code"] and "class Model(" in row["reference_code"]
    assert report["dropped"] == dropped
    assert report["rows_read"] == 1 + sum(dropped.values())


def test_pairs_dir(tmp_path):
    root = tmp_path / "corpus"
    (root / "reference").mkdir(parents=True)
    (root / "kernels").mkdir()
    (root / "reference" / "relu.py").write_text(REFERENCE)
    (root / "kernels" / "relu.py").write_text(CANDIDATE)
    (root / "reference" / "orphan.py").write_text(REFERENCE)  # no kernel file
    (root / "reference" / "broken.py").write_text(REFERENCE)
    (root / "kernels" / "broken.py").write_text(CANDIDATE.replace("def forward", "def forward(("))
    (root / "meta.yaml").write_text("relu: {level: 1}\n")
    rows, report = _ingest({"kind": "pairs_dir", "path": "corpus"}, tmp_path)
    _check_one_kept(rows, report, {"missing_field": 1, "syntax_error": 1})
    assert rows[0]["level"] == 1 and rows[0]["task_name"] == "relu"


def _code_rows():
    good = {"reference": REFERENCE, "candidate": CANDIDATE, "level": 2, "task_name": "relu"}
    return [
        good,
        dict(good),  # duplicate
        {"reference": REFERENCE, "candidate": None},  # missing field
        {"reference": REFERENCE, "candidate": CANDIDATE.replace("ModelNew", "Other")},
        {"reference": REFERENCE.replace("class Model", "class Net"), "candidate": CANDIDATE},
        {"reference": "x", "candidate": "y"},
    ]


EXPECTED_CODE_DROPS = {"duplicate": 1, "missing_field": 1, "no_modelnew": 1, "no_model": 1, "too_short": 1}


def test_local_parquet(tmp_path):
    pq.write_table(pa.Table.from_pylist(_code_rows()), tmp_path / "c.parquet")
    rows, report = _ingest({"kind": "parquet", "path": "c.parquet"}, tmp_path)
    _check_one_kept(rows, report, EXPECTED_CODE_DROPS)
    assert rows[0]["level"] == 2


def test_local_jsonl_with_a_broken_line(tmp_path):
    lines = [json.dumps(r) for r in _code_rows()] + ["{not json", "[1, 2]"]
    (tmp_path / "c.jsonl").write_text("\n".join(lines) + "\n")
    rows, report = _ingest({"kind": "jsonl", "path": "c.jsonl"}, tmp_path)
    _check_one_kept(rows, report, {**EXPECTED_CODE_DROPS, "malformed": 2})


def test_local_json_with_column_mapping(tmp_path):
    renamed = [{"pytorch_code": r["reference"], "cuda_code": r["candidate"]} for r in _code_rows()]
    (tmp_path / "c.json").write_text(json.dumps(renamed + ["not an object"]))
    source = {"kind": "json", "path": "c.json",
              "columns": {"reference": "pytorch_code", "candidate": "cuda_code"}}
    rows, report = _ingest(source, tmp_path)
    _check_one_kept(rows, report, {**EXPECTED_CODE_DROPS, "malformed": 1})


def test_released_sft_json(tmp_path):
    rows_in = [
        {"prompt": _prompt(REFERENCE), "response": _response(CANDIDATE)},
        {"prompt": _prompt(REFERENCE), "response": "I cannot help with that."},  # no code
        {"prompt": "no code here", "response": _response(CANDIDATE)},  # no reference
        {"instruction": "wrong layout"},
    ]
    (tmp_path / "cuke.json").write_text(json.dumps(rows_in))
    rows, report = _ingest({"kind": "sft_json", "path": "cuke.json"}, tmp_path)
    _check_one_kept(rows, report, {"missing_field": 3})
    assert rows[0]["reasoning"] == "use a clamp"


def test_cudallm_parquet_with_chat_turns(tmp_path):
    rows_in = [
        {"prompts": [{"role": "system", "content": "be brief"}, {"role": "user", "content": _prompt(REFERENCE)}],
         "responses": _response(CANDIDATE)},
        {"prompts": [{"role": "user", "content": _prompt(REFERENCE)}],
         "responses": _response(CANDIDATE.replace("class ModelNew(nn.Module):", "class ModelNew(nn.Module"))},
    ]
    pq.write_table(pa.Table.from_pylist(rows_in), tmp_path / "cudallm.parquet")
    rows, report = _ingest({"kind": "cudallm_parquet", "path": "cudallm.parquet"}, tmp_path)
    _check_one_kept(rows, report, {"syntax_error": 1})


def test_hub_source_through_datasets(tmp_path):
    """`hub` goes through datasets.load_dataset; a local dataset folder stands in for an id."""
    folder = tmp_path / "hubdata"
    folder.mkdir()
    pq.write_table(pa.Table.from_pylist(_code_rows()), folder / "train.parquet")
    rows, report = _ingest({"kind": "hub", "path": str(folder), "split": "train"}, tmp_path)
    _check_one_kept(rows, report, EXPECTED_CODE_DROPS)


def test_missing_source_says_what_to_do(tmp_path):
    with pytest.raises(SourceError, match="source.path in params.yaml"):
        list(iter_records({"kind": "jsonl", "path": "absent.jsonl"}, tmp_path))
    (tmp_path / "bad.json").write_text("{oops")
    with pytest.raises(SourceError, match="not valid JSON"):
        list(iter_records({"kind": "json", "path": "bad.json"}, tmp_path))


def test_extraction_rules():
    text = "```cpp\nint a;\n```\nthen\n```python\nprint(2)\n```"
    assert extract.pick_block(text, "first") == "int a;\n"
    assert extract.pick_block(text, "last") == "print(2)\n"
    assert extract.pick_block("no fences", "first") is None
    assert extract.reference_from_prompt(_prompt(REFERENCE)).startswith("import torch")


def test_benchmark_layouts_agree(kernelbench_parquet, tmp_path):
    """The shared KernelBench parquet and the same tasks laid out as a checkout load alike."""
    import pyarrow.parquet as pq

    from dicepipe.data.benchmark import load_benchmark

    from_parquet = load_benchmark({"kind": "parquet", "path": str(kernelbench_parquet), "levels": [1, 2, 3]})
    assert from_parquet.num_rows == 250
    for row in pq.read_table(kernelbench_parquet).to_pylist():
        folder = tmp_path / f"level{row['level']}"
        folder.mkdir(exist_ok=True)
        (folder / f"{row['name']}.py").write_text(row["code"])
    from_dir = load_benchmark({"kind": "kernelbench_dir", "path": str(tmp_path), "levels": [1, 2, 3]})
    assert from_dir.to_pylist() == from_parquet.to_pylist()
    counts = {lvl: from_dir.column("level").to_pylist().count(lvl) for lvl in (1, 2, 3)}
    assert counts == {1: 100, 2: 100, 3: 50}
