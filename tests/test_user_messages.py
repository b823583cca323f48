"""Messages that say what is wrong and what fixes it: a truncated Parquet,
a candidate file that is not UTF-8, a YAML syntax error in params.yaml (under dicepipe and
under Snakemake), a target naming an unknown scale, references with no candidate."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
from dag_tools import copy_workflow
from dicepipe.cli import main
from dicepipe.config import load_params
from dicepipe.data.schema import SFT_SCHEMA, empty_table, read_table, write_table
from dicepipe.errors import ConfigError, StageInputError
from dicepipe.evaluation.kernel_files import read_folder
from kernelharness.testing import RELU_REF

NOT_UTF8 = b"# caf\xe9 kernel\nclass ModelNew: pass\n"


def _truncated(path):
    write_table(empty_table(SFT_SCHEMA), path, SFT_SCHEMA)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_truncated_parquet_names_the_file_its_stage_and_the_command(repo_root, tmp_path,
                                                                     monkeypatch):
    for name in ("dvc.yaml", "real/dvc.yaml", "params.yaml"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(repo_root / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    # a real scale's file: its stage addressed through real/dvc.yaml
    real = tmp_path / "data/cuke/concur/sft.parquet"
    real.parent.mkdir(parents=True)
    _truncated(real)
    with pytest.raises(StageInputError, match=r"Stage real/dvc\.yaml:assemble@concur writes it"):
        read_table("data/cuke/concur/sft.parquet", SFT_SCHEMA)
    path = tmp_path / "data/cuke/seed/sft.parquet"
    path.parent.mkdir(parents=True)
    _truncated(path)
    with pytest.raises(StageInputError) as caught:
        read_table("data/cuke/seed/sft.parquet", SFT_SCHEMA)
    message = str(caught.value)
    assert message.startswith("data/cuke/seed/sft.parquet: not a readable Parquet file")
    assert "Stage assemble@seed writes it" in message
    assert "`snakemake --cores 2 --forcerun data/cuke/seed/sft.parquet`" in message
    assert "`dvc repro --force --single-item assemble@seed && dvc repro`" in message
    # a file no stage writes (a user's --pairs): named, with no stage to re-run
    mine = tmp_path / "pairs.parquet"
    _truncated(mine)
    assert main(["score", "--params", "params.yaml", "--backend", "cpu", "--pairs", str(mine),
                 "--out", str(tmp_path / "o.parquet")]) == 2
    with pytest.raises(StageInputError, match="no stage in dvc.yaml writes it"):
        read_table(mine, SFT_SCHEMA)


def test_non_utf8_candidate_is_a_row_and_unpaired_references_are_named(repo_root, tmp_path,
                                                                        capsys, caplog):
    refs, cands = tmp_path / "refs", tmp_path / "cands"
    refs.mkdir()
    cands.mkdir()
    (refs / "relu.py").write_text(RELU_REF)
    (cands / "relu.py").write_bytes(NOT_UTF8)
    (refs / "lonely.py").write_text(RELU_REF)  # no candidate of that name
    out = tmp_path / "scores.parquet"
    assert main(["score", "--params", str(repo_root / "params.yaml"), "--backend", "cpu",
                 "--cache-dir", str(tmp_path / "cache"), "--references", str(refs),
                 "--candidates", str(cands), "--out", str(out)]) == 0
    (row,) = pq.read_table(out).to_pylist()
    assert row["job_id"] == "relu" and row["error_phase"] == "load" and not row["compiled"]
    assert row["error"].startswith(f"{cands / 'relu.py'}: not UTF-8 text (byte 0xe9 at offset 5)")
    captured = capsys.readouterr()
    printed = captured.out
    assert "1 kernels: 0 compiled" in printed
    assert "1 files could not be read (rows with their reason): relu.py" in printed
    assert "1 references have no candidate (not scored): lonely.py" in printed
    # and as warnings while the run goes on (the CLI logs to stderr)
    assert "references have no candidate of the same name" in captured.err + caplog.text
    assert "not UTF-8 text" in captured.err + caplog.text


def test_non_utf8_baseline_file_is_a_candidate_with_its_reason(tmp_path):
    folder = tmp_path / "baseline"
    folder.mkdir()
    (folder / "level_1_problem_1_sample_0_kernel.py").write_bytes(NOT_UTF8)
    (folder / "level_1_problem_2_sample_0_kernel.py").write_text("class ModelNew: pass\n")
    tasks = [{"task_id": f"L1/t{i}", "level": 1, "problem_id": i, "name": f"t{i}"}
             for i in (1, 2)]
    bad, good = read_folder(folder, tasks, relative_to=tmp_path)
    assert bad.code is None and good.code is not None
    assert bad.note == ("unreadable_file: baseline/level_1_problem_1_sample_0_kernel.py: not "
                        "UTF-8 text (byte 0xe9 at offset 5). Save it as UTF-8 (e.g. `iconv -f "
                        "latin1 -t utf-8`) and run again; the other files were scored.")


def _broken_params(text: str) -> tuple[str, int]:
    """params.yaml with a tab-indented key under `scales:` (YAML allows no tabs there)."""
    lines = text.splitlines()
    index = lines.index("scales:") + 1
    lines.insert(index, "\tnope: {}")
    return "\n".join(lines) + "\n", index + 1


def test_yaml_syntax_error_has_its_line_and_column(repo_root, tmp_path):
    text, line = _broken_params((repo_root / "params.yaml").read_text())
    path = tmp_path / "params.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_params(path)
    assert str(caught.value).startswith(f"{path}: not valid YAML at line {line}, column 1: "
                                        "found character '\\t' that cannot start any token")
    assert f"`dicepipe check-params --params {path}`" in str(caught.value)


@pytest.fixture
def workflow_copy(repo_root, tmp_path):
    (tmp_path / "wf").mkdir()
    return copy_workflow(repo_root, tmp_path / "wf")


def _dry_run(workdir, *targets):
    return subprocess.run([sys.executable, "-m", "snakemake", "-n", "--cores", "1", *targets],
                          cwd=workdir, capture_output=True, text=True, timeout=300, check=False)


def test_snakemake_reports_the_yaml_line_too(workflow_copy):
    params = workflow_copy / "params.yaml"
    text, line = _broken_params(params.read_text())
    params.write_text(text)
    run = _dry_run(workflow_copy)
    assert run.returncode != 0
    assert f"params.yaml: not valid YAML at line {line}, column 1" in run.stdout + run.stderr


def test_snakemake_names_the_valid_scales_for_an_unknown_one(workflow_copy):
    run = _dry_run(workflow_copy, "results/kernelbench_nope.csv")
    assert run.returncode != 0
    scales = list(load_params(workflow_copy / "params.yaml")["scales"])
    assert (f"results/kernelbench_nope.csv: scale 'nope' is not in params.yaml (`scales`), so "
            f"no rule writes it (it would be rule evaluate's output). Expected one of {scales}"
            in run.stdout + run.stderr)
    # the rules that name the valid values stay out of every real target's way
    run = _dry_run(workflow_copy, "results/kernelbench_compare_tiny.csv", "models/sft/tiny")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "unknown_" not in run.stdout + run.stderr
