"""params.yaml schema errors: one clear message naming file, key, value and expectation."""

from __future__ import annotations

import copy
import re
import subprocess
import sys

import pytest
import yaml

from dicepipe.config import load_params, resolve_scale, stage_settings, validate_params
from dicepipe.errors import ConfigError


@pytest.fixture()
def raw(repo_root):
    return yaml.safe_load((repo_root / "params.yaml").read_text())


def test_shipped_params_are_valid(params):
    assert resolve_scale(params, "tiny").backend == "cpu"
    # the real scales read the folder acquire@sdar-8b fills from the hub
    assert resolve_scale(params, "8b").model_spec["path"] == "data/external/sdar-8b"
    assert params["acquire"]["sdar-8b"]["repo_id"] == "JetLM/SDAR-8B-Chat"
    tiny = stage_settings(params, "sft", scale="tiny")
    assert tiny["epochs"] == params["sft"]["overrides"]["tiny"]["epochs"]
    assert stage_settings(params, "sft", scale="8b")["learning_rate"] == 1e-5


@pytest.mark.parametrize(
    "edit, key, words",
    [
        (lambda p: p["assemble"].__setitem__("speedup_threshold", -1), "assemble.speedup_threshold", "-1"),
        (lambda p: p["assemble"].__setitem__("speedup_threshold", "fast"), "assemble.speedup_threshold", "'fast'"),
        (lambda p: p["verify"].__setitem__("repeats", 0), "verify.repeats", "0"),
        (lambda p: p["scales"]["tiny"].__setitem__("backend", "tpu"), "scales.tiny.backend", "'tpu'"),
        (lambda p: p["harness"].__setitem__("bogus_knob", 1), "harness", "bogus_knob"),
        (lambda p: p["harness"]["measure"].__setitem__("bogus", 1), "harness.measure", "bogus"),
        # a params.yaml of the earlier shape: the message says where each key went
        (lambda p: p["harness"].__setitem__("timing_trials", 50), "harness",
         "'harness.timing_trials' is now 'harness.measure.timing_trials'"),
        (lambda p: p["harness"].__setitem__("robust", True), "harness", "augment.robust"),
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
    del trimmed["harness"]["measure"]["timing_trials"]
    assert validate_params(trimmed)["harness"]["measure"]["timing_trials"] == 50
    del trimmed["harness"]["run"]
    assert validate_params(trimmed)["harness"]["run"]["build_workers"] == 0


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


def test_scale_names_have_no_dots_so_dvc_can_track_each_scale(raw, params):
    """DVC addresses params by dotted path: a scale `1.7b` could only be tracked through its
    parent (every scale re-run on any scale's edit). The schema refuses it, naming the fix."""
    from dicepipe.config import lookup, split_key

    assert split_key(params, "sft.overrides.1p7b") == ["sft", "overrides", "1p7b"]
    assert lookup(params, "scales.1p7b.backend") == "cuda"
    bad = copy.deepcopy(raw)
    bad["scales"]["1.7b"] = bad["scales"].pop("1p7b")
    with pytest.raises(ConfigError, match=r"1\.7b.*1p7b, not 1\.7b"):
        validate_params(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        split_key(params, "scales.2b")


@pytest.mark.parametrize("edit, rule", [
    (lambda p: p["assemble"].__setitem__("speedup_threshold", -1), "must be greater than 0"),
    (lambda p: p["verify"].__setitem__("repeats", 50), "must be at most 20"),
    (lambda p: p["harness"]["measure"].__setitem__("correct_trials", 1.5),
     "must be a whole number"),
    (lambda p: p["augment"].__setitem__("author", "human"), "must be one of"),
])
def test_messages_name_the_rule_the_value_breaks(raw, edit, rule):
    bad = copy.deepcopy(raw)
    edit(bad)
    with pytest.raises(ConfigError, match=rule):
        validate_params(bad)


def test_params_header_names_the_schema_that_exists(repo_root):
    from dicepipe.config import SCHEMA_PATH

    header = (repo_root / "params.yaml").read_text().split("\n\n")[0]
    named = re.findall(r"\S+\.schema\.\w+", header)
    assert named and all((repo_root / name).is_file() for name in named), named
    assert (repo_root / named[0]).resolve() == SCHEMA_PATH
