"""Damaged checkpoints and model folders, and a full disk: a model folder a stage reads is
checked against its manifest (or, without one, its headers) and a damaged one is named with
the stage and the command that write it; a damaged newest work-folder checkpoint falls back
to the one before, none left whole restarts the run, both said in the log; a disk without
room for a checkpoint stops the stage before anything is written."""

from __future__ import annotations

import json
import logging
import shutil
from collections import namedtuple
from pathlib import Path

import pytest
import torch
from dicepipe.errors import CheckpointError
from dicepipe.model import manifest
from dicepipe.model.loading import build_tiny, load_saved, save_model
from dicepipe.model.tokenizer import train_tiny_tokenizer
from test_rl_train import _run as run_toy_rl
from test_rl_train import _settings as toy_rl_settings
from test_rl_train import _tasks as toy_tasks
from test_rl_train import _tsv_without_wall_time, _without_wall_time
from test_sft_train import _run_stage as run_sft_stage
from test_sft_train import _write_split

TEXTS = ["Write a kernel for: return torch.relu(x)", "```cpp\ny[i] = x[i] > 0 ? x[i] : 0;\n```"] * 3


def _save_tiny(params, folder: Path) -> None:
    spec = {**params["models"]["tiny-init"], "vocab_size": 400, "num_hidden_layers": 1}
    save_model(folder, build_tiny(spec, train_tiny_tokenizer(TEXTS, 400)))


def _truncate(path: Path, keep_bytes: int | None = None) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2 if keep_bytes is None else keep_bytes])


def test_truncated_model_folder_is_named_with_the_stage_and_command_that_write_it(
        params, repo_root, tmp_path, monkeypatch):
    """models/sft/tiny cut short, then rl-infill through the CLI: exit 2, and its log (not an
    empty one) names the file, that sft@tiny writes it and the commands that rebuild it."""
    from dicepipe.cli import main

    monkeypatch.chdir(tmp_path)
    for name in ("dvc.yaml", "params.yaml"):
        shutil.copy(repo_root / name, tmp_path / name)
    _save_tiny(params, Path("models/sft/tiny"))
    files = json.loads(Path("models/sft/tiny/MANIFEST.json").read_text())["files"]
    assert {"model.safetensors", "config.json", "tokenizer.json", "block_diffusion.json"} <= set(files)
    load_saved("models/sft/tiny")  # whole: loads
    _truncate(Path("models/sft/tiny/model.safetensors"))

    log_file = tmp_path / "logs" / "rl_infill" / "tiny.log"
    code = main(["rl-infill", "--scale", "tiny", "--model", "models/sft/tiny", "--data", "none.parquet",
                 "--val", "none.parquet", "--out", "models/rl_infill/tiny", "--metrics",
                 "metrics/rl_infill/tiny", "--device", "cpu", "--log", str(log_file)])
    assert code == 2
    message = log_file.read_text()
    assert "models/sft/tiny/model.safetensors has" in message and "cut short" in message
    assert "Stage sft@tiny writes it" in message
    assert "`snakemake --cores 2 --forcerun models/sft/tiny`" in message
    assert "`dvc repro --force --single-item sft@tiny && dvc repro`" in message
    assert not Path("models/rl_infill").exists()  # stopped before any work

    # the same folder with a byte changed in place (same size): the manifest's hash sees it
    _save_tiny(params, Path("models/sft/tiny"))
    weights = Path("models/sft/tiny/model.safetensors")
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="does not match the sha256 its manifest records"):
        load_saved("models/sft/tiny")


def test_folders_without_a_manifest_load_and_are_checked_by_their_headers(params, repo_root, tmp_path,
                                                                          monkeypatch):
    """The shipped base and folders written before manifests load; cut short, they are named
    by their safetensors header; the shipped one is restored with git."""
    monkeypatch.chdir(repo_root)
    assert manifest.folder_problems(Path("data/base/tiny")) == []
    assert "`git checkout -- data/base/tiny`" in manifest.rebuild_hint(Path("data/base/tiny"))

    old = tmp_path / "old"
    _save_tiny(params, old)
    (old / manifest.MANIFEST).unlink()
    load_saved(old)
    _truncate(old / "model.safetensors", 5000)
    with pytest.raises(CheckpointError, match=r"model.safetensors has 5,000 bytes where its header needs"):
        load_saved(old)


def test_a_large_folder_is_hashed_once_then_trusted_by_its_stamp(params, tmp_path, monkeypatch):
    """Above HASH_EVERY_READ_BYTES the hashes are checked on the first read and stamped;
    the next read hashes nothing; a file rewritten (new modification time) is hashed again."""
    monkeypatch.setattr(manifest, "HASH_EVERY_READ_BYTES", 0)
    monkeypatch.setattr(manifest, "STAMP_DIR", tmp_path / "stamps")
    folder = tmp_path / "big"
    _save_tiny(params, folder)  # save_model stamps what it has just hashed
    hashed = []
    real = manifest.sha256_file
    monkeypatch.setattr(manifest, "sha256_file", lambda path: hashed.append(Path(path).name) or real(path))
    assert manifest.folder_problems(folder) == [] and hashed == []
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))  # same size, new modification time
    assert "does not match the sha256" in manifest.folder_problems(folder)[0]
    assert hashed == ["model.safetensors"]


@pytest.fixture(scope="module")
def sft_runs(params, tmp_path_factory):
    """An uninterrupted SFT stage run (6 steps, checkpoints every 2) and the split it read."""
    import copy

    short = copy.deepcopy(params)
    short["sft"]["overrides"]["tiny"].update(epochs=3, per_device_batch_size=2, save_every_steps=2,
                                             pack=False)
    root = tmp_path_factory.mktemp("sft")
    data = root / "sft.parquet"
    _write_split(data)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert run_sft_stage(short, data, root / "straight") == 0
    finally:
        torch.set_num_threads(threads)
    return short, data, root / "straight"


def _stopped_at_4(short, data, run: Path) -> Path:
    assert run_sft_stage(short, data, run, stop_after=4) == 0
    work = run / "model.work"
    assert sorted(p.name for p in work.glob("step-*")) == ["step-00000002", "step-00000004"]  # two kept
    return work


def _summary(run: Path) -> dict:
    return json.loads((run / "metrics" / "summary.json").read_text())


def test_damaged_newest_checkpoint_falls_back_to_the_one_before(sft_runs, tmp_path, caplog, one_thread):
    """step-4's weights cut short: the re-run names it, removes it, resumes from step 2 and
    ends with the uninterrupted run's model, byte for byte."""
    short, data, straight = sft_runs
    run = tmp_path / "run"
    work = _stopped_at_4(short, data, run)
    shard = next((work / "step-00000004").glob("*.distcp"))
    _truncate(shard)
    shutil.rmtree(run / "metrics", ignore_errors=True)
    with caplog.at_level(logging.WARNING, logger="dicepipe.train.checkpoint"):
        assert run_sft_stage(short, data, run) == 0
    text = caplog.text
    assert f"checkpoint {work / 'step-00000004'} (step 4) is damaged: {shard} has" in text
    assert f"resuming from the previous checkpoint, {work / 'step-00000002'} (step 2), instead" in text
    assert _summary(run)["resumed_at_steps"] == [2]
    assert (run / "model" / "model.safetensors").read_bytes() == \
        (straight / "model" / "model.safetensors").read_bytes()


def test_no_intact_checkpoint_restarts_the_stage_from_step_zero(sft_runs, tmp_path, caplog, one_thread):
    """Both kept checkpoints damaged (a file changed in place, a manifest cut short): the
    re-run says it starts again from step 0, and does, to the uninterrupted run's model."""
    short, data, straight = sft_runs
    run = tmp_path / "run"
    work = _stopped_at_4(short, data, run)
    (work / "step-00000004" / "progress.json").write_text('{"train_time_s": 1}\n')
    _truncate(work / "step-00000002" / manifest.MANIFEST)
    shutil.rmtree(run / "metrics", ignore_errors=True)
    with caplog.at_level(logging.WARNING, logger="dicepipe.train.checkpoint"):
        assert run_sft_stage(short, data, run) == 0
    assert "step-00000004 (step 4) is damaged" in caplog.text
    assert "step-00000002 (step 2) is damaged" in caplog.text
    assert f"no intact checkpoint is left in {work}: the stage starts again from step 0" in caplog.text
    assert _summary(run)["resumed_at_steps"] == []
    assert (run / "model" / "model.safetensors").read_bytes() == \
        (straight / "model" / "model.safetensors").read_bytes()


def test_a_full_disk_stops_the_stage_before_a_checkpoint_is_written(sft_runs, params, tmp_path, monkeypatch,
                                                                   one_thread):
    """shutil.disk_usage reports 1 MiB free: the first checkpoint (step 2) is refused with its
    path, the space it needs and the space there is, and nothing of it is on disk; a model
    folder likewise."""
    short, data, _straight = sft_runs
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(manifest.shutil, "disk_usage", lambda path: usage(1 << 40, (1 << 40) - (1 << 20), 1 << 20))
    run = tmp_path / "run"
    with pytest.raises(CheckpointError) as caught:
        run_sft_stage(short, data, run)
    message = str(caught.value)
    assert f"no space left for the training checkpoint at {run / 'model.work' / 'step-00000002'}:" in message
    assert "it needs about" in message and "MiB, the disk holding it has 1.0 MiB free" in message
    assert list((run / "model.work").glob("step-*")) == []
    with pytest.raises(CheckpointError, match="no space left for the model folder at"):
        _save_tiny(params, tmp_path / "model")
    assert not (tmp_path / "model").exists() and not (tmp_path / "model.tmp").exists()


def test_rl_falls_back_to_the_checkpoint_before_with_its_selection(params, tmp_path, caplog, one_thread):
    """The RL loop (toy model and reward, validation every step, checkpoints every step):
    stopped at 3, step-3 damaged, resumed from step 2 with the best model that checkpoint
    names, and the logs, selection and model are the uninterrupted run's."""
    settings = toy_rl_settings(params, steps=4, save_every_steps=1, eval_every_steps=1)
    val = type(toy_tasks(1))(toy_tasks(1).tasks, toy_tasks(1).prompt_ids, 0)
    full_summary, _ = run_toy_rl(tmp_path / "full", settings, val=val)
    from dicepipe.train.rl import RunOptions

    assert run_toy_rl(tmp_path / "cut", settings, RunOptions(stop_after_steps=3), val=val)[0] is None
    work = tmp_path / "cut" / "work"
    assert sorted(p.name for p in work.glob("step-*")) == ["step-00000002", "step-00000003"]
    _truncate(next((work / "step-00000003").glob("*.distcp")))
    shutil.rmtree(tmp_path / "cut" / "metrics", ignore_errors=True)
    with caplog.at_level(logging.WARNING, logger="dicepipe.train.checkpoint"):
        summary, _ = run_toy_rl(tmp_path / "cut", settings, val=val)
    assert "(step 3) is damaged" in caplog.text and "(step 2), instead" in caplog.text
    assert summary["resumed_at_steps"] == [2]
    assert _without_wall_time(summary) == _without_wall_time(full_summary)
    full, cut = tmp_path / "full" / "metrics", tmp_path / "cut" / "metrics"
    assert (cut / "val.tsv").read_text() == (full / "val.tsv").read_text()
    assert _tsv_without_wall_time(cut / "steps.tsv") == _tsv_without_wall_time(full / "steps.tsv")
    assert (tmp_path / "cut" / "model" / "model.safetensors").read_bytes() == \
        (tmp_path / "full" / "model" / "model.safetensors").read_bytes()
