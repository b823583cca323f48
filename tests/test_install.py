"""The package works when installed as a library (not only `pip install -e`): the params
schema ships inside it, so a regular install validates params.yaml."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_non_editable_install_validates_params(repo_root, tmp_path):
    source = tmp_path / "src"  # a copy: building in place would leave build/ in the checkout
    shutil.copytree(repo_root / "workflow" / "dicepipe", source / "workflow" / "dicepipe",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(repo_root / name, source / name)
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--no-build-isolation", "--target", str(site), str(source)],
                   check=True, capture_output=True, text=True)
    assert (site / "dicepipe" / "schemas" / "params.schema.yaml").is_file()

    run_dir = tmp_path / "run"  # no checkout here: only params.yaml
    run_dir.mkdir()
    shutil.copy2(repo_root / "params.yaml", run_dir / "params.yaml")
    env = {**os.environ, "PYTHONPATH": str(site)}
    where = subprocess.run([sys.executable, "-c", "import dicepipe.config as c; print(c.SCHEMA_PATH)"],
                           cwd=run_dir, env=env, capture_output=True, text=True, check=True)
    assert where.stdout.strip().startswith(str(site)), where.stdout
    ok = subprocess.run([sys.executable, "-m", "dicepipe.cli", "check-params"], cwd=run_dir,
                        env=env, capture_output=True, text=True, check=False)
    assert ok.returncode == 0, ok.stderr
    assert "params.yaml: valid" in ok.stdout

    bad = (run_dir / "params.yaml").read_text().replace("speedup_threshold: 2.0",
                                                        "speedup_threshold: -1", 1)
    assert "speedup_threshold: -1" in bad
    (run_dir / "params.yaml").write_text(bad)
    refused = subprocess.run([sys.executable, "-m", "dicepipe.cli", "check-params"], cwd=run_dir,
                             env=env, capture_output=True, text=True, check=False)
    assert refused.returncode == 2
    assert "must be greater than 0" in refused.stderr
