"""A stage refuses to run another checkout's code: rules call the `dicepipe` on PATH, so with
the package installed from one checkout, a second checkout's stages would run the first's code
while Snakemake and DVC track the second's files."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import dicepipe
from dag_tools import copy_workflow
from dicepipe.cli import CheckoutMismatchError, check_checkout
from dicepipe.errors import DicepipeError

IMPORTED = Path(dicepipe.__file__).resolve().parent


def _check_params(workdir: Path, pythonpath: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return subprocess.run([sys.executable, "-m", "dicepipe.cli", "check-params", "--out", "checked.json"],
                          cwd=workdir, env=env, capture_output=True, text=True, check=False)


def test_a_second_checkout_with_other_code_is_refused_with_the_fix(repo_root, tmp_path):
    other = copy_workflow(repo_root, tmp_path)
    stage = other / "workflow/dicepipe/stages/check_params.py"
    stage.write_text(stage.read_text() + "\n# this checkout's own edit\n")

    refused = _check_params(other)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert not (other / "checked.json").exists()
    message = refused.stderr
    assert f"dicepipe is imported from {IMPORTED}" in message
    assert str((other / "workflow/dicepipe").resolve()) in message
    assert "`pip install -e ./harness -e .` in " + str(other.resolve()) in message
    assert f"PYTHONPATH={(other / 'workflow').resolve()}" in message

    # the fix the message names: the checkout's own code runs
    fixed = _check_params(other, pythonpath=str(other / "workflow"))
    assert fixed.returncode == 0, fixed.stderr
    assert (other / "checked.json").is_file()


def test_another_checkouts_harness_is_refused_with_the_fix(repo_root, tmp_path):
    """The runners track this checkout's method version: its harness must be the one that runs."""
    other = copy_workflow(repo_root, tmp_path)
    method = other / "harness/src/kernelharness/method.py"
    method.write_text(method.read_text() + "\n# this checkout's own edit\n")
    refused = _check_params(other)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "kernelharness is imported from" in refused.stderr
    assert "`pip install -e ./harness` in " + str(other.resolve()) in refused.stderr
    harness_src = other / "harness" / "src"
    fixed = _check_params(other, pythonpath=str(harness_src))
    assert fixed.returncode == 0, fixed.stderr


def test_a_byte_identical_copy_runs(repo_root, tmp_path):
    """DVC's `exp run --temp`/`--queue` run stages in a copy of the repository."""
    copy = copy_workflow(repo_root, tmp_path)
    ran = _check_params(copy)
    assert ran.returncode == 0, ran.stderr


def test_the_check_compares_only_from_a_repository(tmp_path):
    check_checkout(tmp_path)  # no workflow/dicepipe here: `dicepipe score` anywhere
    fake = tmp_path / "repo" / "workflow" / "dicepipe"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    try:
        check_checkout(tmp_path / "repo")
    except CheckoutMismatchError as exc:
        assert isinstance(exc, DicepipeError)
    else:
        raise AssertionError("a checkout with other code was accepted")
    check_checkout(tmp_path / "repo", imported=fake)
    shutil.rmtree(fake.parent.parent)
