"""`dicepipe score`: the harness from outside, on a folder pair and on a Parquet of pairs."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from dicepipe.cli import main
from kernelharness import RESULT_SCHEMA
from kernelharness.testing import IDENTITY_REF, RELU_REF, python_candidate

GOOD = python_candidate("return x.clamp_min(0)")
WRONG = python_candidate("return x")  # identity: right only on non-negative inputs


@pytest.fixture
def folders(tmp_path):
    refs, cands = tmp_path / "refs", tmp_path / "cands"
    refs.mkdir()
    cands.mkdir()
    (refs / "relu.py").write_text(RELU_REF)
    (cands / "relu.py").write_text(GOOD)
    (refs / "relu_as_identity.py").write_text(RELU_REF)
    (cands / "relu_as_identity.py").write_text(WRONG)
    (cands / "orphan.py").write_text(GOOD)  # no reference of that name: skipped
    return refs, cands


def _score(repo_root, tmp_path, *args):
    return main(["score", "--params", str(repo_root / "params.yaml"), "--backend", "cpu",
                 "--cache-dir", str(tmp_path / "cache"), *args])


def test_score_folders(repo_root, tmp_path, folders, capsys):
    refs, cands = folders
    out = tmp_path / "scores.parquet"
    assert _score(repo_root, tmp_path, "--references", str(refs), "--candidates", str(cands),
                  "--out", str(out)) == 0
    table = pq.read_table(out)
    assert table.schema.equals(RESULT_SCHEMA)
    rows = {r["job_id"]: r for r in table.to_pylist()}
    assert set(rows) == {"relu", "relu_as_identity"}
    assert rows["relu"]["correct"] and not rows["relu_as_identity"]["correct"]
    # ReLU as identity passes on get_inputs()'s [0, 1) draws; the negated trial catches it
    assert "negated" in rows["relu_as_identity"]["error"]
    printed = capsys.readouterr().out
    # each protocol by name: KernelBench's own check draws [0, 1) only and accepts both
    assert "2 kernels: 2 compiled" in printed and "[strict] 1 correct" in printed
    assert "[kernelbench] 2 correct" in printed and "[kernelbench_v0] 2 correct" in printed
    assert "[release_reward] 2 correct" in printed and "fast_1" in printed


def test_score_pairs_parquet(repo_root, tmp_path):
    pairs = tmp_path / "pairs.parquet"
    pq.write_table(pa.table({"name": ["a", "b"], "reference_code": [RELU_REF, IDENTITY_REF],
                             "candidate_code": [GOOD, WRONG]}), pairs)
    out = tmp_path / "scores.parquet"
    assert _score(repo_root, tmp_path, "--pairs", str(pairs), "--out", str(out),
                  "--repeats", "2", "--thresholds", "1.0", "2.0") == 0
    rows = {r["job_id"]: r for r in pq.read_table(out).to_pylist()}
    assert rows["a"]["correct"] and rows["b"]["correct"]  # x vs x * 1.0: the same values
    assert all(1 <= r["num_repeats"] <= 2 for r in rows.values())


def test_score_reports_bad_input(repo_root, tmp_path):
    assert _score(repo_root, tmp_path, "--pairs", str(tmp_path / "missing.parquet"),
                  "--out", str(tmp_path / "o.parquet")) == 2
