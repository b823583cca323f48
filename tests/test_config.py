"""params.yaml schema errors: one clear message naming file, key, value and expectation."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import yaml

from dicepipe.config import load_params, resolve_scale, sft_settings, validate_params
from dicepipe.errors import ConfigError


@pytest.fixture()
def raw(repo_root):
    return yaml.safe_load((repo_root / "params.yaml").read_text())


def test_shipped_params_are_valid(params):
    assert resolve_scale(params, "tiny").backend == "cpu"
    assert resolve_scale(params, "8b").model_spec["path"] == "JetLM/SDAR-8B-Chat"
    assert sft_settings(params, "tiny")["epochs"] == params["sft"]["overrides"]["tiny"]["epochs"]
    assert sft_settings(params, "8b")["learning_rate"] == 1e-5


@pytest.mark.parametrize(
    "edit, key, words",
    [
        (lambda p: p["assemble"].__setitem__("speedup_threshold", -1), "assemble.speedup_threshold", "-1"),
        (lambda p: p["assemble"].__setitem__("speedup_threshold", "fast"), "assemble.speedup_threshold", "'fast'"),
        (lambda p: p["verify"].__setitem__("repeats", 0), "verify.repeats", "0"),
        (lambda p: p["scales"]["tiny"].__setitem__("backend", "tpu"), "scales.tiny.backend", "'tpu'"),
        (lambda p: p["harness"].__setitem__("bogus_knob", 1), "harness", "bogus_knob"),
        (lambda p: p["scales"]["tiny"].__setitem__("corpus", "nope"), "scales.tiny.corpus", "'nope'"),
        (lambda p: p["verify"].__setitem__("shards", ["1-of-2"]), "verify.shards", "1-of-1"),
        (lambda p: p["sft"]["overrides"].pop("8b"), "sft.overrides.8b", "missing"),
    ],
)
def test_bad_values_name_file_key_value_and_expectation(raw, edit, key, words):
    bad = copy.deepcopy(raw)
    edit(bad)
    with pytest.raises(ConfigError) as info:
        validate_params(bad, "params.yaml")
    message = str(info.value)
    assert message.startswith("params.yaml: ")
    assert key in message
    assert words in message
    assert "Expected" in message


def test_schema_fills_defaults(raw):
    trimmed = copy.deepcopy(raw)
    del trimmed["harness"]["timing_trials"]
    assert validate_params(trimmed)["harness"]["timing_trials"] == 50


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_params(tmp_path / "absent.yaml")
    (tmp_path / "bad.yaml").write_text("scales: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_params(tmp_path / "bad.yaml")


def test_cli_refuses_to_run_with_bad_params(repo_root, raw, tmp_path):
    bad = copy.deepcopy(raw)
    bad["verify"]["repeats"] = "five"
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(bad))
    out = tmp_path / "samples.parquet"
    result = subprocess.run(
        [sys.executable, "-m", "dicepipe.cli", "ingest", "--params", str(path), "--corpus", "seed",
         "--out", str(out), "--report", str(tmp_path / "r.json")],
        cwd=repo_root, capture_output=True, text=True)
    assert result.returncode == 2
    assert "verify.repeats" in result.stderr and "'five'" in result.stderr
    assert not out.exists()


def test_snakemake_refuses_bad_params(repo_root, raw, tmp_path):
    from dag_tools import copy_workflow

    copy_workflow(repo_root, tmp_path)
    bad = copy.deepcopy(raw)
    bad["assemble"]["speedup_threshold"] = "fast"
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(bad, sort_keys=False))
    result = subprocess.run([sys.executable, "-m", "snakemake", "-n"], cwd=tmp_path,
                            capture_output=True, text=True)
    assert result.returncode != 0
    assert "speedup_threshold" in result.stdout + result.stderr


def test_dotted_keys_with_dotted_scale_names(params):
    from dicepipe.config import dvc_trackable_key, lookup, split_key

    assert split_key(params, "sft.overrides.1.7b") == ["sft", "overrides", "1.7b"]
    assert lookup(params, "scales.1.7b.backend") == "cuda"
    assert dvc_trackable_key(params, "sft.overrides.tiny") == "sft.overrides"
    assert dvc_trackable_key(params, "models.tiny") == "models.tiny"
    assert dvc_trackable_key(params, "assemble") == "assemble"
    with pytest.raises(ConfigError, match="does not exist"):
        split_key(params, "scales.2b")
