"""The stages behind `snakemake --report`: `dicepipe provenance` (params, package versions,
acquired pins, shipped KernelBench files; deterministic, no absolute paths) and `dicepipe
curves` (the training curves as PNGs, from the logs the training stages publish)."""

from __future__ import annotations

import json
import shutil

import yaml
from dicepipe.cli import main


def _workspace(repo_root, tmp_path, monkeypatch):
    shutil.copy(repo_root / "params.yaml", tmp_path / "params.yaml")
    shutil.copytree(repo_root / "data/kernelbench", tmp_path / "data/kernelbench")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_provenance_records_params_packages_and_pins(repo_root, tmp_path, monkeypatch):
    ws = _workspace(repo_root, tmp_path, monkeypatch)
    out = ws / "results/provenance_tiny.json"
    assert main(["provenance", "--scale", "tiny", "--out", str(out)]) == 0
    first = out.read_bytes()
    record = json.loads(first)
    params = yaml.safe_load((ws / "params.yaml").read_text())
    assert record["scale"] == "tiny" and record["scale_spec"]["corpus"] == params["scales"]["tiny"]["corpus"]
    assert len(record["params_sha256"]) == 64 and record["params"]["assemble"] == {
        **record["params"]["assemble"], **params["assemble"]}
    assert set(record["packages"]) == {"python", "torch", "transformers", "snakemake", "dvc", "dicepipe"}
    assert record["packages"]["torch"]
    # every acquired input with its source and pin as params.yaml names it
    assert record["acquired"]["CuKe"]["files"][0]["git_blob"] == params["acquire"]["CuKe"]["files"][0]["git_blob"]
    assert set(record["acquired"]) == set(params["acquire"])
    assert set(record["shipped"]) == {"data/kernelbench/LICENSE", "data/kernelbench/README.md",
                                      "data/kernelbench/kernelbench_levels_1-3.parquet"}
    assert main(["provenance", "--scale", "tiny", "--out", str(out)]) == 0
    assert out.read_bytes() == first  # no timestamps
    assert str(tmp_path).encode() not in first  # no absolute paths


def test_curves_plot_the_training_logs(repo_root, tmp_path, monkeypatch):
    ws = _workspace(repo_root, tmp_path, monkeypatch)
    (ws / "m/sft").mkdir(parents=True)
    (ws / "m/sft/steps.tsv").write_text("step\tepoch\tloss\tlearning_rate\tgrad_norm\n"
                                        "1\t0\t5.0\t0.001\t2.0\n2\t0\t4.5\t0.001\t1.5\n")
    for stage in ("rl_infill", "rl_e2e"):
        (ws / "m" / stage).mkdir()
        (ws / "m" / stage / "steps.tsv").write_text(
            "step\tmean_reward\tgroups_kept\tupdates\tkl\n1\t0.0\t0\t0\t\n2\t0.5\t1\t1\t0.01\n")
        (ws / "m" / stage / "val.tsv").write_text("step\tval_reward\tval_tasks\n0\t0.0\t2\n")
    args = ["curves", "--scale", "tiny", "--sft", "m/sft", "--rl-infill", "m/rl_infill",
            "--rl-e2e", "m/rl_e2e", "--out", "curves"]
    assert main(args) == 0
    pngs = {p.name: p.read_bytes() for p in (ws / "curves").glob("*.png")}
    assert set(pngs) == {"sft.png", "rl_infill.png", "rl_e2e.png"}
    assert all(b.startswith(b"\x89PNG") for b in pngs.values())
    assert main(args) == 0  # byte-identical on a re-run
    assert {p.name: p.read_bytes() for p in (ws / "curves").glob("*.png")} == pngs
