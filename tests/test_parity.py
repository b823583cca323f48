"""Snakemake and DVC describe the same DAG: same stages, commands, inputs, outputs and
params, for every scale. Later stages add their rule to both runners; this keeps them honest.
DVC's stages lie in two files (dvc.yaml's header): dvc.yaml, the default chain that plain
`snakemake` builds and a target-less `dvc repro` runs, and real/dvc.yaml, the real scales;
the records below are of both, and the split is checked against params.yaml."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dag_tools import (
    DEFAULT_DVC_FILE,
    DVC_ONLY_DEPS,
    DVC_ONLY_STAGES,
    REAL_DVC_FILE,
    acquired_folder,
    closure_problems,
    copy_workflow,
    deps_match,
    dvc_plan,
    dvc_records,
    snakemake_records,
)


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
    """What `rule all` asks of a scale: results, training curves, provenance."""
    return [f"results/kernelbench_{scale}.csv", f"metrics/curves/{scale}/sft.png",
            f"results/provenance_{scale}.json"]


@pytest.mark.parametrize("scale", ["tiny", "1p7b", "4b", "8b", "debug"])
def test_snakemake_and_dvc_agree_for_scale(workspace, dvc_stages, scale):
    params = yaml.safe_load((workspace / "params.yaml").read_text())
    snake = snakemake_records(workspace, _scale_targets(params, scale))
    assert {"sft@" + scale, "rl_infill@" + scale, "rl_e2e@" + scale, "evaluate@" + scale,
            "benchmark@" + params["scales"][scale]["benchmark"]} <= set(snake)
    # evaluation scores the last RL stage's checkpoint
    assert f"models/rl_e2e/{scale}" in snake["evaluate@" + scale].deps
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
        if set(record.params) != other.params:
            problems.append(f"{name}: params differ: snakemake {sorted(record.params)} "
                            f"dvc {sorted(other.params)}")
        dvc_deps = {acquired_folder(d, params.get("acquire", {})) for d in other.deps - DVC_ONLY_DEPS}
        problems += [f"{name}: {p}" for p in deps_match(record.deps, frozenset(dvc_deps))]
    # every DVC stage that feeds this scale's target must be a Snakemake job too
    needed = {n for n in dvc_stages if n.endswith(f"@{scale}")}
    needed.add("benchmark@" + params["scales"][scale]["benchmark"])
    problems += [f"{n}: in dvc.yaml, not in Snakemake" for n in sorted(needed - set(snake))]
    assert not problems, "\n".join(problems)


def test_every_dvc_stage_is_a_snakemake_rule(workspace, dvc_stages):
    params = yaml.safe_load((workspace / "params.yaml").read_text())
    targets = [t for s in params["scales"] for t in _scale_targets(params, s)]
    snake = snakemake_records(workspace, targets)
    corpora_used = {s["corpus"] for s in params["scales"].values()}
    keyed = {n for n in dvc_stages if n not in DVC_ONLY_STAGES}
    benchmarks_used = {"benchmark@" + s["benchmark"] for s in params["scales"].values()}
    expected = {n for n in keyed
                if n.split("@")[1].split("-")[0] in corpora_used | set(params["scales"])
                and not n.startswith("benchmark@")} | benchmarks_used
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
    """`dvc dag` plans both files as one DAG."""
    result = subprocess.run([sys.executable, "-m", "dvc", "dag", "--dot"], cwd=workspace,
                            capture_output=True, text=True, check=True)
    for record in dvc_stages.values():
        assert f'"{record.address}"' in result.stdout
    assert {r.dvcfile for r in dvc_stages.values()} == {DEFAULT_DVC_FILE, REAL_DVC_FILE}


def test_plain_dvc_repro_runs_what_plain_snakemake_runs(workspace, dvc_stages):
    """A target-less `dvc repro` / `dvc exp run` collects dvc.yaml's stages (DVC's
    PROJECT_FILE) and what they depend on: exactly plain `snakemake`'s jobs (check_params
    aside), every one in dvc.yaml, no acquire@ among them (a fresh clone fetches nothing)."""
    snake = snakemake_records(workspace, [])  # no target: `rule all`
    plan = dvc_plan(workspace)
    assert plan[0] == "check_params"
    assert set(plan) == set(snake) | DVC_ONLY_STAGES, sorted(set(plan) ^ set(snake))
    assert {n for n, r in dvc_stages.items() if r.dvcfile == DEFAULT_DVC_FILE} == set(plan)
    assert not [n for n in plan if n.startswith("acquire@")], plan


@pytest.mark.parametrize("scale", ["1p7b", "4b", "8b", "debug"])
def test_one_dvc_command_runs_a_real_scale_as_snakemake_does(workspace, scale):
    """A real scale is one command: `dvc repro real/dvc.yaml:evaluate@<s>` (its table, what
    `snakemake -- results/kernelbench_<s>.csv` runs), and `dvc repro --glob
    'real/dvc.yaml:*@<s>'` (every stage of the scale, as `rule all` for a default scale)."""
    params = yaml.safe_load((workspace / "params.yaml").read_text())
    table = snakemake_records(workspace, [f"results/kernelbench_{scale}.csv"])
    plan = dvc_plan(workspace, [f"{REAL_DVC_FILE}:evaluate@{scale}"])
    assert {p.split(":")[-1] for p in plan} == set(table) | DVC_ONLY_STAGES
    everything = snakemake_records(workspace, _scale_targets(params, scale))
    plan = dvc_plan(workspace, [f"{REAL_DVC_FILE}:*@{scale}"], glob=True)
    assert {p.split(":")[-1] for p in plan} == set(everything) | DVC_ONLY_STAGES


def _foreach_keys(spec: dict, section: str) -> list[str]:
    """A foreach's keys, each of whose entries must be params.yaml's own (`${section.key}`)."""
    each = spec["foreach"]
    assert isinstance(each, dict), spec["foreach"]
    assert all(value == f"${{{section}.{key}}}" for key, value in each.items()), each
    return list(each)


def test_the_dvc_files_split_params_as_default_scales_says(repo_root):
    """DVC's foreach cannot filter, so each file names its keys (dvc.yaml's header): dvc.yaml
    the default scales and the corpora and benchmarks they read, real/dvc.yaml every other
    scale, corpus and benchmark and every acquire entry; each entry read from params.yaml."""
    params = yaml.safe_load((repo_root / "params.yaml").read_text())
    default = list(params["default_scales"])
    used = {"corpora": {params["scales"][s]["corpus"] for s in default},
            "benchmarks": {params["scales"][s]["benchmark"] for s in default}}
    wanted = {
        DEFAULT_DVC_FILE: {"scales": set(default), **used},
        REAL_DVC_FILE: {"scales": set(params["scales"]) - set(default),
                        **{k: set(params[k]) - v for k, v in used.items()}},
    }
    section_of = {"ingest": "corpora", "verify_gather": "corpora", "augment": "corpora",
                  "assemble": "corpora", "benchmark": "benchmarks"}
    stages_of = {}
    for name, want in wanted.items():
        spec = yaml.safe_load((repo_root / name).read_text())
        stages = spec["stages"]
        stages_of[name] = set(stages)
        for stage, body in stages.items():
            if stage in ("check_params", "acquire"):
                continue
            if stage == "verify":
                keys = body["matrix"]["corpus"]
                assert body["matrix"]["shard"] == "${verify.shards}"
                section = "corpora"
            else:
                section = section_of.get(stage, "scales")
                keys = _foreach_keys(body, section)
            assert set(keys) == want[section] and len(keys) == len(set(keys)), (name, stage, keys)
        if name == REAL_DVC_FILE:
            assert stages["acquire"]["foreach"] == "${acquire}"
            # paths relative to the repository root, params read from its params.yaml
            assert all((body.get("do", body)).get("wdir") == ".." for body in stages.values())
            assert "../params.yaml" in spec["vars"]
    root_vars = yaml.safe_load((repo_root / DEFAULT_DVC_FILE).read_text())["vars"]
    real_vars = yaml.safe_load((repo_root / REAL_DVC_FILE).read_text())["vars"]
    assert [v for v in real_vars if isinstance(v, dict)] == root_vars
    # the same stages in both (check_params once, in dvc.yaml; acquire in real/dvc.yaml)
    assert stages_of[DEFAULT_DVC_FILE] - {"check_params"} == stages_of[REAL_DVC_FILE] - {"acquire"}


def test_dvc_deps_cover_every_module_each_stage_imports(workspace, dvc_stages):
    """Each stage's code deps are its import closure (dicepipe.deps): the rules take it as
    inputs, and dvc.yaml must list folders or files covering it."""
    problems = closure_problems(dvc_stages, workspace / "workflow" / "dicepipe")
    assert not problems, "\n".join(problems)


def test_a_stage_importing_an_unlisted_module_fails_the_check(repo_root, dvc_stages, tmp_path):
    copy = copy_workflow(repo_root, tmp_path)
    stage = copy / "workflow/dicepipe/stages/ingest.py"
    stage.write_text(stage.read_text() + "\nfrom ..augment import tasks as _tasks  # noqa: E402\n")
    problems = closure_problems({"ingest@seed": dvc_stages["ingest@seed"]},
                                copy / "workflow" / "dicepipe")
    assert any("workflow/dicepipe/augment/tasks.py" in p for p in problems), problems
    snake = snakemake_records(copy, ["data/ingest/seed/samples.parquet"])
    assert "workflow/dicepipe/augment/tasks.py" in snake["ingest@seed"].deps


def test_every_dvc_stage_descends_from_check_params(dvc_stages):
    """DVC deletes a stage's outputs right before running it: params must be validated
    upstream of every stage, so a bad value never costs a previous result."""
    producers = {out: name for name, r in dvc_stages.items() for out in r.outs}

    def parents(record):
        return {producers[o] for d in record.deps for o in producers
                if o == d or o.startswith(d.rstrip("/") + "/")}

    orphans = []
    for name in dvc_stages:
        seen, todo = set(), [name]
        while todo:
            current = todo.pop()
            seen.add(current)
            todo += [p for p in parents(dvc_stages[current]) if p not in seen]
        if name != "check_params" and "check_params" not in seen:
            orphans.append(name)
    assert not orphans, f"stages that may run before params are checked: {orphans}"
