"""Verification split into shards (separate jobs on a cluster) gives the same table as one
job: every sample measured once, in the same order, with the same deterministic columns
(timings are measurements and vary). The real stages on part of the shipped corpus (the
pipeline test's subset, whose builds it shares, plus one sample for each shard that subset
leaves empty), trimmed trials."""

from __future__ import annotations

import os
import shutil

import pyarrow.parquet as pq
import pytest
import yaml
from dicepipe.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

# tests/test_pipeline.py's CORPUS_SUBSET (all in shards 2 and 3 of 3) + layer_norm (shard 1)
# and gelu_tanh (shard 2): every shard of three gets work.
SAMPLES = ["relu", "rms_norm", "softmax_rows", "scale_residual_gelu", "matmul_square",
           "mlp_block", "layer_norm", "gelu_tanh"]

# Columns a re-measurement may change: runtimes and what is derived from them, wall times,
# and cache bookkeeping (a second run finds its builds cached).
VARYING = ("runtime", "speedup", "wall_", "num_repeats", "timing_mode", "launch_bound",
           "kb_", "builds_cached", "reused", "compile_log_tail", "memory", "flag_ext_not_called")


def _deterministic(table):
    names = [n for n in table.column_names if not any(v in n for v in VARYING)]
    return table.select(names).to_pylist()


def _corpus(repo_root, tmp_path):
    corpus = tmp_path / "corpus"
    for folder in ("reference", "kernels"):
        (corpus / folder).mkdir(parents=True)
        for name in SAMPLES:
            shutil.copy2(repo_root / "data/seed/corpus" / folder / f"{name}.py", corpus / folder)
    return corpus


def _params(repo_root, tmp_path, shards: list[str], build_cache) -> str:
    params = yaml.safe_load((repo_root / "params.yaml").read_text())
    params["corpora"]["seed"]["source"]["path"] = str(tmp_path / "corpus")
    params["verify"].update(repeats=1, shards=shards)
    params["harness"]["measure"].update(correct_trials=2, warmup_trials=1, timing_trials=3,
                                        timing_trials_cpu=3)
    params["harness"]["run"]["cache_dir"] = str(build_cache)
    path = tmp_path / f"params-{len(shards)}.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return str(path)


def _verify(params: str, samples, out_dir, shards: list[str]):
    for shard in shards:
        assert main(["verify", "--params", params, "--corpus", "seed", "--samples", str(samples),
                     "--shard", shard, "--out", str(out_dir / f"{shard}.parquet")]) == 0
    joined = out_dir / "measurements.parquet"
    assert main(["verify-gather", "--params", params, "--corpus", "seed", "--shards-dir",
                 str(out_dir), "--out", str(joined)]) == 0
    return pq.read_table(joined)


def test_three_shards_give_the_same_deterministic_columns_as_one(repo_root, tmp_path,
                                                                   build_cache_dir, monkeypatch):
    _corpus(repo_root, tmp_path)
    monkeypatch.chdir(tmp_path)  # resume files under .cache/ of this folder, not the checkout
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    one, three = ["1-of-1"], ["1-of-3", "2-of-3", "3-of-3"]
    params_one = _params(repo_root, tmp_path, one, build_cache_dir)
    samples = tmp_path / "samples.parquet"
    assert main(["ingest", "--params", params_one, "--corpus", "seed", "--out", str(samples),
                 "--report", str(tmp_path / "report.json")]) == 0
    single = _verify(params_one, samples, tmp_path / "one", one)
    sharded = _verify(_params(repo_root, tmp_path, three, build_cache_dir), samples,
                      tmp_path / "three", three)
    sizes = [pq.read_table(tmp_path / "three" / f"{s}.parquet").num_rows for s in three]
    assert sum(sizes) == single.num_rows == pq.read_table(samples).num_rows == len(SAMPLES)
    assert all(sizes), f"a shard got no sample: {sizes}"
    assert sharded.column_names == single.column_names
    assert _deterministic(sharded) == _deterministic(single)
    assert sum(single.column("correct").to_pylist()) > 0
