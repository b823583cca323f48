"""Re-planning on a finished default run, without running a stage.

A copy of the workflow with the shipped seed data gets stand-in outputs for every stage of
the default chain (plain `snakemake`'s jobs, dvc.yaml's stages), recorded as finished by both
runners (`snakemake --touch -F`, `dvc commit`).
Editing, adding or removing a corpus or benchmark file must then re-plan exactly the stages
that read it (Snakemake dry run, `dvc status`); the README's experiment must reach only
`check_params` and `assemble` onward; DVC's rewrite of params.yaml keeps every comment, and
the README's failed experiment leaves params.yaml as it was."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from dag_tools import DEFAULT_DVC_FILE, _cwd, copy_workflow, dvc_plan, snakemake_records

TARGET = "results/kernelbench_tiny.csv"
DOWNSTREAM_OF_INGEST = {"ingest": 1, "verify": 2, "verify_gather": 1, "assemble": 1, "sft": 1,
                        "rl_infill": 1, "rl_e2e": 1, "evaluate": 1}
DOWNSTREAM_OF_BENCHMARK = {"benchmark": 1, "evaluate": 1}
GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}


def _run(cmd, cwd, check=True):
    env = {**os.environ, **GIT_ENV, "DVC_NO_ANALYTICS": "1"}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=check,
                          shell=isinstance(cmd, str))


def _bin(name: str) -> str:
    return str(Path(sys.executable).parent / name)


@pytest.fixture(scope="module")
def finished(repo_root, tmp_path_factory) -> Path:
    """A git + DVC repository of the workflow whose default chain (`rule all`, dvc.yaml)
    both runners record as run."""
    ws = copy_workflow(repo_root, tmp_path_factory.mktemp("finished"))
    for folder in ("data/seed", "data/baselines", "data/base"):
        if (repo_root / folder).is_dir():
            shutil.copytree(repo_root / folder, ws / folder, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(repo_root / ".gitignore", ws / ".gitignore")
    records = snakemake_records(ws, [])  # no target: `rule all`
    for out in sorted({o for r in records.values() for o in r.outs} | {"data/checked/params.json"}):
        path = ws / out
        if path.suffix:  # stand-in files; stage outputs without a suffix are folders
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"stand-in for {out}\n")
        else:
            path.mkdir(parents=True, exist_ok=True)
            (path / "stand-in.txt").write_text(f"stand-in for {out}\n")
    _run(["git", "init", "-q"], ws)
    _run([_bin("dvc"), "init", "-q"], ws)
    _run([_bin("snakemake"), "--touch", "-F", "--cores", "1"], ws)
    _run([_bin("dvc"), "commit", "--force", DEFAULT_DVC_FILE], ws)
    _run(["git", "add", "-A"], ws)
    _run(["git", "commit", "-q", "-m", "finished default run"], ws)
    assert _snakemake_plan(ws) == {}, "the stand-in run is not up to date under Snakemake"
    assert _dvc_changed(ws) == _dvc_changed(ws, DEFAULT_DVC_FILE) == set()
    return ws


def _snakemake_plan(ws: Path) -> dict[str, int]:
    """Jobs a dry run would start, by rule (its "Job stats" table)."""
    result = _run([_bin("snakemake"), "-n", "--cores", "1", "--", TARGET], ws)
    out = result.stdout + result.stderr
    if "Nothing to be done" in out:
        return {}
    table = out.split("Job stats:", 1)[1].split("total", 1)[0]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)\s*$", table, re.MULTILINE)}


def _dvc_changed(ws: Path, target: str = "evaluate@tiny") -> set[str]:
    from dvc.repo import Repo

    with _cwd(ws), Repo(".") as repo:
        return set(repo.status(targets=[target], with_deps=True))


def _first(folder: Path) -> Path:
    return min(p for p in folder.iterdir() if p.suffix == ".py")


CORPUS = "data/seed/chains"
BENCH = "data/seed/benchmark/level1"


def _edit(ws, rel):
    path = _first(ws / rel)
    original = path.read_text()
    path.write_text(original.replace("1.0", "1.5", 1) if "1.0" in original else original + "\n# edited\n")
    return lambda: path.write_text(original)


def _add_corpus_pair(ws, _rel):
    ref = _first(ws / CORPUS / "reference")
    kernel = ws / CORPUS / "kernels" / ref.name
    added = [ws / CORPUS / "reference" / "zz_added.py", ws / CORPUS / "kernels" / "zz_added.py"]
    added[0].write_text(ref.read_text())
    added[1].write_text(kernel.read_text())
    return lambda: [p.unlink() for p in added]


def _add_bench_task(ws, rel):
    added = ws / rel / "99_Added.py"
    added.write_text(_first(ws / rel).read_text())
    return added.unlink


def _remove(ws, rel):
    path = _first(ws / rel)
    original = path.read_bytes()
    path.unlink()
    return lambda: path.write_bytes(original)


CHANGES = [
    ("edit", _edit, CORPUS + "/reference", DOWNSTREAM_OF_INGEST, "ingest@seed"),
    ("add", _add_corpus_pair, CORPUS, DOWNSTREAM_OF_INGEST, "ingest@seed"),
    ("remove", _remove, CORPUS + "/kernels", DOWNSTREAM_OF_INGEST, "ingest@seed"),
    ("edit", _edit, BENCH, DOWNSTREAM_OF_BENCHMARK, "benchmark@seed"),
    ("add", _add_bench_task, BENCH, DOWNSTREAM_OF_BENCHMARK, "benchmark@seed"),
    ("remove", _remove, BENCH, DOWNSTREAM_OF_BENCHMARK, "benchmark@seed"),
]


@pytest.mark.parametrize("kind,change,where,snake_jobs,dvc_stage", CHANGES,
                         ids=[f"{c[0]}-{c[2].split('/')[2]}" for c in CHANGES])
def test_a_changed_input_file_replans_exactly_its_readers(finished, kind, change, where,
                                                          snake_jobs, dvc_stage):
    undo = change(finished, where)
    try:
        assert _snakemake_plan(finished) == snake_jobs
        assert _dvc_changed(finished) == {dvc_stage}
    finally:
        undo()
    assert _dvc_changed(finished) == set()


MEASURING = {"verify": 2, "verify_gather": 1, "augment": 1, "assemble": 1, "sft": 1,
             "rl_infill": 1, "rl_e2e": 1, "evaluate": 1}


def test_harness_code_and_run_settings_replan_nothing_its_method_version_replans_measuring(
        finished):
    """Measuring stages track the harness's method version and `harness.measure`, not its
    source files: a docstring in its build code and a build-speed setting re-plan nothing in
    either runner; raising METHOD_VERSION re-plans verify, augment and all that follows."""
    builder = finished / "harness/src/kernelharness/compilation/builder.py"
    method = finished / "harness/src/kernelharness/method.py"
    params = finished / "params.yaml"
    originals = {p: p.read_text() for p in (builder, method, params)}
    try:
        builder.write_text(originals[builder].replace('"""', '"""A docstring edit. ', 1))
        assert _snakemake_plan(finished) == {}
        assert _dvc_changed(finished) == set()
        params.write_text(originals[params].replace("    build_workers: 0", "    build_workers: 3"))
        assert originals[params] != params.read_text(), "params.yaml has no harness.run.build_workers"
        assert _snakemake_plan(finished) == {}
        # DVC validates any edit of params.yaml again (check_params); no stage follows it
        assert _dvc_changed(finished) == {"check_params"}
        params.write_text(originals[params])
        version = int(re.search(r"^METHOD_VERSION = (\d+)", originals[method], re.M).group(1))
        method.write_text(originals[method].replace(f"METHOD_VERSION = {version}",
                                                    f"METHOD_VERSION = {version + 1}"))
        assert _snakemake_plan(finished) == MEASURING
        assert _dvc_changed(finished) == {"verify@seed-1-of-2", "verify@seed-2-of-2",
                                          "augment@seed", "rl_infill@tiny", "rl_e2e@tiny",
                                          "evaluate@tiny"}
    finally:
        for path, text in originals.items():
            path.write_text(text)
    assert _snakemake_plan(finished) == {}
    assert _dvc_changed(finished) == set()


def _readme_commands(repo_root: Path, program: str) -> list[list[str]]:
    lines = (repo_root / "README.md").read_text().splitlines()
    return [shlex.split(line.split("||")[0].split("  #")[0]) for line in lines if line.startswith(program)]


def test_readme_experiment_reaches_only_the_tiny_chain_from_assemble(repo_root, finished):
    """The README's `dvc exp run -S` plans stages that fetch nothing (no acquire@; without a
    target: dvc.yaml's, the default chain), and the changed value reaches check_params and
    assemble only (their outputs then re-run what follows), and provenance, which records
    params.yaml: applied with DVC's own params rewrite, on the finished run."""
    from dvc.utils.hydra import apply_overrides

    commands = [c for c in _readme_commands(repo_root, "dvc exp run") if "-S" in c]
    assert commands, "README prints no `dvc exp run -S` command"
    for words in commands:
        overrides = [words[i + 1] for i, w in enumerate(words) if w == "-S"]
        targets = [w for w in words[3:] if not w.startswith("-") and w not in overrides]
        planned = dvc_plan(finished, targets)
        assert "assemble@seed" in planned
        assert not [s for s in planned if "acquire@" in s], (targets, planned)
        params = finished / "params.yaml"
        original = params.read_text()
        try:
            apply_overrides(str(params), overrides)
            for target in targets or [DEFAULT_DVC_FILE]:
                assert _dvc_changed(finished, target) == (
                    {"check_params", "assemble@seed"} | ({"provenance@tiny"} & set(planned)))
        finally:
            params.write_text(original)


def _comments(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip().startswith("#")]


def _content_lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.splitlines() if line.strip()]


@pytest.mark.parametrize("overrides", [["assemble.speedup_threshold=2.5"],
                                       ["verify.decision_thresholds=[1.5,2.5]", "evaluate.fast_p=[1.0]",
                                        "augment.families=[mha]", "default_scales=[tiny,8b]",
                                        "harness.measure.correct_trials=3",
                                        "harness.run.build_workers=2"]])
def test_dvc_params_rewrite_keeps_every_comment(repo_root, tmp_path, overrides):
    """DVC's `-S` rewrite (ruamel round trip, every list replaced) leaves params.yaml as it
    was but for the values set: every comment kept, nothing re-indented (blank lines after a
    list and trailing spaces aside)."""
    from dvc.utils.hydra import apply_overrides

    params = tmp_path / "params.yaml"
    shutil.copy2(repo_root / "params.yaml", params)
    original = params.read_text()
    apply_overrides(str(params), overrides)
    rewritten = params.read_text()
    assert _comments(rewritten) == _comments(original)
    changed = [(a, b) for a, b in zip(_content_lines(original), _content_lines(rewritten)) if a != b]
    if overrides == ["assemble.speedup_threshold=2.5"]:
        assert _content_lines(rewritten) != _content_lines(original)
        assert changed == [("  speedup_threshold: 2.0", "  speedup_threshold: 2.5")]


def test_readme_experiment_as_printed_keeps_comments_and_a_failure_restores(repo_root, finished):
    """The README's `dvc exp run` line, on check_params alone (cheap): a successful run keeps
    every comment; a value check_params refuses fails the experiment, and the line's fallback
    puts params.yaml back as committed."""
    (line,) = [raw for raw in (repo_root / "README.md").read_text().splitlines()
               if raw.startswith("dvc exp run -S")]
    command = line.split("  #")[0].strip()
    assert "||" in command, "a failed experiment would leave its value in params.yaml"
    params = finished / "params.yaml"
    original = params.read_text()
    # its target, if any, replaced by check_params
    ok = re.sub(r"( evaluate@tiny)? \|\|", " check_params ||", command, count=1)
    assert ok != command and "check_params" in ok
    result = _run(ok.replace("dvc ", _bin("dvc") + " ", 1), finished, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert _comments(params.read_text()) == _comments(original)
    assert yaml.safe_load(params.read_text())["assemble"]["speedup_threshold"] == 2.5
    params.write_text(original)
    _run(["git", "add", "params.yaml"], finished)

    bad = ok.replace("assemble.speedup_threshold=2.5", "assemble.speedup_threshold=-1")
    assert bad != ok
    failed = _run(bad.replace("dvc ", _bin("dvc") + " ", 1), finished, check=False)
    assert "must be greater than 0" in failed.stdout + failed.stderr
    assert params.read_text() == original
    assert _run(["git", "status", "--porcelain", "params.yaml"], finished).stdout == ""


def test_readme_exp_show_has_a_few_columns(repo_root):
    """`dvc exp show` as the README prints it, through DVC's own column filter, on the
    columns a run of every stage would have: every param (check_params tracks the whole
    file), the metrics of every stage (evaluate's: level x protocol x verdict x metric) and
    every dep."""
    import argparse

    from dicepipe.evaluation.metrics import metric_names
    from dvc.commands.experiments.show import show_experiments
    from dvc.compare import TabularData
    from dvc.utils.flatten import flatten

    (words,) = [w for w in _readme_commands(repo_root, "dvc exp show")]
    parser = argparse.ArgumentParser()
    parser.add_argument("--drop", action="append", default=[])
    parser.add_argument("--keep", action="append", default=[])
    parser.add_argument("--only-changed", action="store_true")
    args, _ = parser.parse_known_args(words[3:])
    params = yaml.safe_load((repo_root / "params.yaml").read_text())
    metric_cols = [f"{level}.{p}.{verdict}.{m}" for level in ("1", "2", "3", "all")
                   for p in params["evaluate"]["protocols"] for verdict in ("plain", "robust")
                   for m in metric_names(params["evaluate"]["fast_p"], params["evaluate"]["pass_k"])]
    metric_cols += ["split_sizes.sft", "split_sizes.val", "kept", "loss", "mean_reward"]
    param_cols = list(flatten(params))
    dep_cols = ["data/ingest/seed/samples.parquet", "models/rl_e2e/tiny", "workflow/dicepipe/model"]
    headers = ["Experiment", "rev", "typ", "Created", "parent", "State", "Executor",
               *metric_cols, *param_cols, *dep_cols]
    assert len(headers) > 300
    td = TabularData(headers, fill_value="-")
    td.append(["workspace", "workspace", "baseline", "-", "", "", "", *["1"] * (len(headers) - 7)])
    show_experiments(td, {"metrics": metric_cols, "params": param_cols, "deps": dep_cols},
                     keep=args.keep, drop=args.drop, only_changed=args.only_changed,
                     pager=False, csv=True)
    shown = list(td.keys())
    assert "Experiment" in shown and "assemble.speedup_threshold" in shown
    assert {"all.kernelbench_v0.plain.exec", "all.strict.robust.fast_1_point"} <= set(shown)
    assert len(shown) <= 12, shown
