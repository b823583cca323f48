"""`dicepipe wheelhouse`: what an offline machine lacks is worked out from its package list and
the project's requirements, the target's versions constrain the resolver, the package it
brings itself (torch) is never fetched, and source-only packages are spotted. No network:
pip's resolver and downloads are not run here (the command line they get is checked)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dicepipe.stages import wheelhouse as wh

REPO = Path(__file__).resolve().parent.parent


def test_the_targets_list_is_read_from_pip_freeze_or_bare_names():
    have = wh.parse_have("\n".join([
        "torch==2.11.0+cu130", "Typing_Extensions==4.12.2", "-e git+https://x/y#egg=z",
        "mypkg @ file:///tmp/mypkg", "# a comment", "PyYAML", "", "numpy==2.1.0  # pinned"]))
    assert have == {"torch": "2.11.0", "typing-extensions": "4.12.2", "pyyaml": None,
                    "numpy": "2.1.0"}


def test_only_what_the_target_lacks_or_holds_too_old_is_resolved():
    requirements = ["torch>=2.6", "transformers>=4.56", "jsonschema>=4.20", "datasets>=3.0",
                    "pyyaml>=6"]
    have = {"torch": "2.11.0", "transformers": "5.17.0", "jsonschema": "4.10.0", "pyyaml": None}
    assert wh.missing_requirements(requirements, have, ["torch"]) == ["jsonschema>=4.20",
                                                                       "datasets>=3.0"]
    # torch is the target's own build whatever its state: never resolved, never pinned
    assert wh.missing_requirements(["torch>=9"], {}, ["torch"]) == []
    assert wh.constraints_text(have, ["torch"]) == "jsonschema==4.10.0\ntransformers==5.17.0\n"


def test_the_shipped_project_on_the_gpu_machines_list_needs_four_requirements():
    """The GPU machines' image (its package names, as the device notes list them) lacks
    snakemake, dvc, jsonschema and datasets of the project's own requirements."""
    names = ["accelerate", "matplotlib", "ninja", "pyarrow", "pyyaml", "tokenizers", "torch",
             "tqdm", "transformers", "numpy", "pandas"]
    have = wh.parse_have("\n".join(names))
    missing = wh.missing_requirements(wh.project_requirements(REPO / "pyproject.toml", []), have,
                                      wh.DEFAULT_KEEP)
    assert sorted(m.split(">")[0] for m in missing) == ["datasets", "dvc", "jsonschema", "snakemake"]


def report(*items) -> dict:
    return {"install": [{"metadata": {"name": n, "version": v},
                         "download_info": {"url": url}} for n, v, url in items]}


def test_resolved_packages_the_target_has_are_not_fetched_and_a_kept_one_is_an_error():
    resolved = report(("Snakemake", "9.27.1", "https://h/snakemake-9.27.1-py3-none-any.whl"),
                      ("numpy", "2.1.0", "https://h/numpy-2.1.0-cp312-cp312-manylinux.whl"),
                      ("pyyaml", "6.0.3", "https://h/pyyaml.whl"),
                      ("connection_pool", "0.0.3", "https://h/connection_pool-0.0.3.tar.gz"))
    have = {"numpy": "2.1.0", "pyyaml": None}
    assert wh.to_fetch(resolved, have, ["torch"]) == [("connection-pool", "0.0.3"),
                                                      ("snakemake", "9.27.1")]
    assert wh.sdist_only(resolved) == [("connection-pool", "0.0.3")]
    with pytest.raises(wh.WheelhouseError, match="torch .* --have"):
        wh.to_fetch(report(("torch", "2.11.0", "https://h/torch.whl")), {}, ["torch"])


def test_pip_is_asked_for_the_targets_python_and_platform(tmp_path):
    flags = wh.target_flags("3.12", ["manylinux_2_28_x86_64"])
    resolve = wh.resolve_command(["dvc>=3.50"], flags, tmp_path / "c.txt", tmp_path / "r.json",
                                 tmp_path / "t", tmp_path / "built")
    assert resolve[1:4] == ["-m", "pip", "install"] and "--dry-run" in resolve
    assert resolve[resolve.index("--python-version") + 1] == "3.12"
    assert resolve[resolve.index("--platform") + 1] == "manylinux_2_28_x86_64"
    assert "--only-binary=:all:" in resolve and resolve[-1] == "dvc>=3.50"
    assert resolve[resolve.index("-c") + 1] == str(tmp_path / "c.txt")
    download = wh.download_command([("dvc", "3.67.1")], flags, tmp_path / "out")
    assert "--no-deps" in download and download[-1] == "dvc==3.67.1"


def test_an_unknown_extra_is_refused_with_the_groups_there():
    with pytest.raises(wh.WheelhouseError, match="no optional-dependency group 'gpu'.*cluster"):
        wh.project_requirements(REPO / "pyproject.toml", ["gpu"])


def test_a_target_that_has_everything_fetches_nothing(tmp_path, capsys, monkeypatch):
    from dicepipe.cli import main

    names = [r.split(">")[0].split("=")[0] for r in wh.project_requirements(REPO / "pyproject.toml", [])]
    have = tmp_path / "have.txt"
    have.write_text("\n".join(names) + "\n")
    monkeypatch.chdir(REPO)
    assert main(["wheelhouse", "--out", str(tmp_path / "wheels"), "--have", str(have)]) == 0
    assert "nothing to fetch" in capsys.readouterr().out
    assert not (tmp_path / "wheels").exists()


def test_the_manifest_lists_only_this_runs_wheels(tmp_path):
    for name in ("dvc-3.67.1-py3-none-any.whl", "connection_pool-0.0.3-py3-none-any.whl",
                 "old_pkg-1.0-py3-none-any.whl"):
        (tmp_path / name).write_bytes(name.encode())
    manifest = wh.write_manifest(tmp_path, [("connection-pool", "0.0.3"), ("dvc", "3.67.1")], {})
    assert [w["file"] for w in manifest["wheels"]] == ["connection_pool-0.0.3-py3-none-any.whl",
                                                       "dvc-3.67.1-py3-none-any.whl"]
    assert (tmp_path / "requirements.txt").read_text() == "connection-pool==0.0.3\ndvc==3.67.1\n"
