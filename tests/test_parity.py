"""Snakemake and DVC describe the same DAG: same stages, commands, inputs, outputs and
params, for every scale. Later stages add their rule to both files; this keeps them honest."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dicepipe.config import dvc_trackable_key

from dag_tools import copy_workflow, deps_match, dvc_records, snakemake_records


@pytest.fixture(scope="module")
def workspace(repo_root, tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("parity")
    copy_workflow(repo_root, dest)
    subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], cwd=dest, check=True)
    return dest


@pytest.fixture(scope="module")
def dvc_stages(workspace):
    return dvc_records(workspace)


def _scale_targets(params: dict, scale: str) -> list[str]:
    return [f"models/sft/{scale}"]


@pytest.mark.parametrize("scale", ["tiny", "1.7b", "4b", "8b"])
def test_snakemake_and_dvc_agree_for_scale(workspace, dvc_stages, scale):
    params = yaml.safe_load((workspace / "params.yaml").read_text())
    snake = snakemake_records(workspace, _scale_targets(params, scale))
    assert "sft@" + scale in snake
    assert snake, "Snakemake built an empty DAG"
    problems = []
    for name, record in sorted(snake.items()):
        if name not in dvc_stages:
            problems.append(f"{name}: in Snakemake, not in dvc.yaml")
            continue
        other = dvc_stages[name]
        if record.cmd != other.cmd:
            problems.append(f"{name}: commands differ\n  snakemake: {record.cmd}\n  dvc:       {other.cmd}")
        if record.outs != other.outs:
            problems.append(f"{name}: outputs differ: {sorted(record.outs ^ other.outs)}")
        if {dvc_trackable_key(params, k) for k in record.params} != other.params:
            problems.append(f"{name}: params differ: snakemake {sorted(record.params)} "
                            f"dvc {sorted(other.params)}")
        problems += [f"{name}: {p}" for p in deps_match(record.deps, other.deps)]
    # every DVC stage that feeds this scale's target must be a Snakemake job too
    needed = {n for n in dvc_stages if n.endswith(f"@{scale}")}
    problems += [f"{n}: in dvc.yaml, not in Snakemake" for n in sorted(needed - set(snake))]
    assert not problems, "\n".join(problems)


def test_every_dvc_stage_is_a_snakemake_rule(workspace, dvc_stages):
    params = yaml.safe_load((workspace / "params.yaml").read_text())
    targets = [t for s in params["scales"] for t in _scale_targets(params, s)]
    snake = snakemake_records(workspace, targets)
    corpora_used = {s["corpus"] for s in params["scales"].values()}
    expected = {n for n in dvc_stages
                if n.split("@")[1].split("-")[0] in corpora_used | set(params["scales"])}
    assert expected == set(snake) & expected
    assert set(snake) <= set(dvc_stages)


def test_snakemake_lint_and_format_are_clean(repo_root):
    result = subprocess.run([sys.executable, "-m", "snakemake", "--lint", "-n"], cwd=repo_root,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "good condition" in result.stdout + result.stderr
    snakefmt = Path(sys.executable).parent / "snakefmt"
    if snakefmt.exists():
        fmt = subprocess.run([snakefmt, "--check", "Snakefile", "workflow/rules"], cwd=repo_root,
                             capture_output=True, text=True)
        assert fmt.returncode == 0, fmt.stdout + fmt.stderr


def test_profiles_and_envs_parse(repo_root):
    default = yaml.safe_load((repo_root / "profiles/default/config.yaml").read_text())
    assert default["resources"]["gpu"] >= 1, "the gpu resource must be a real limit"
    slurm = yaml.safe_load((repo_root / "profiles/slurm/config.yaml").read_text())
    assert slurm["executor"] == "slurm"
    env = yaml.safe_load((repo_root / "envs/dicepipe.yaml").read_text())
    assert any(isinstance(d, dict) and "pip" in d for d in env["dependencies"])


def test_dvc_dag_lists_same_stages_as_stage_list(workspace, dvc_stages):
    result = subprocess.run([sys.executable, "-m", "dvc", "dag", "--dot"], cwd=workspace,
                            capture_output=True, text=True, check=True)
    for name in dvc_stages:
        assert f'"{name}"' in result.stdout
