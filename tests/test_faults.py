"""Trust after faults, on a finished default run of stand-in outputs (no stage is run but
the one a scenario needs): a training stage stopped by SIGTERM saves a checkpoint and the
next plan of the same command re-plans it and everything made from it; params compare by
value; a hand-placed input is checked against its pin; one run at a time per folder, under
either runner, naming the other run."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml
from dag_tools import copy_workflow, snakemake_records

pytestmark = pytest.mark.timeout(300)

BIN = Path(sys.executable).parent
TARGET = "results/kernelbench_tiny.csv"


def _env(ws: Path, **extra) -> dict:
    # the copy's own package (the checkout guard compares it with the imported one)
    return {**os.environ, "DVC_NO_ANALYTICS": "1", "PYTHONPATH": str(ws / "workflow"),
            "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", **extra}


def _run(args, ws: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], check=False, cwd=ws, env=env or _env(ws),
                          capture_output=True,
                          text=True, timeout=240)


def _plan(result: subprocess.CompletedProcess) -> set[str]:
    return set(re.findall(r"^rule (\w+):", result.stdout + result.stderr, re.MULTILINE)) - {"all"}


def _sft_split(path: Path) -> None:
    """A real SFT split: the one stage the kill scenario runs."""
    import pyarrow as pa
    from dicepipe.data.schema import SFT_SCHEMA, write_table

    rows = [{"sample_id": f"s{i}", "origin": "corpus", "level": 1, "prompt": f"Write a kernel for op {i}",
             "response": f"```cpp\ny[i] = x[i] * {i};\n```"} for i in range(4)]
    write_table(pa.Table.from_pylist(rows, schema=SFT_SCHEMA), path, SFT_SCHEMA)


def _edit_params(ws: Path, edit) -> None:
    params = yaml.safe_load((ws / "params.yaml").read_text())
    edit(params)
    (ws / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


@pytest.fixture(scope="module")
def finished(repo_root, tmp_path_factory) -> Path:
    """The workflow's default chain recorded as run by Snakemake (`--touch`) over stand-in
    outputs, a real SFT split among them, in a DVC project."""
    ws = copy_workflow(repo_root, tmp_path_factory.mktemp("faults"))
    shutil.copytree(repo_root / "data" / "seed", ws / "data" / "seed", dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    records = snakemake_records(ws, [])
    for out in sorted({o for r in records.values() for o in r.outs}):
        path = ws / out
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix:
            path.write_text(f"stand-in for {out}\n")
        else:
            path.mkdir(exist_ok=True)
            (path / "stand-in.txt").write_text(f"stand-in for {out}\n")
    _sft_split(ws / "data/cuke/seed/sft.parquet")
    _edit_params(ws, lambda p: p["sft"]["overrides"]["tiny"].update(epochs=500, save_every_steps=1000))
    assert _run([BIN / "dvc", "init", "--no-scm", "-q"], ws).returncode == 0
    touched = _run([BIN / "snakemake", "--touch", "-F", "--cores", "1"], ws)
    assert touched.returncode == 0, touched.stderr[-2000:]
    assert "Nothing to be done" in _run([BIN / "snakemake", "-n", "--cores", "1"], ws).stdout
    return ws


def _descendant(proc: subprocess.Popen, *words: str) -> psutil.Process | None:
    for child in psutil.Process(proc.pid).children(recursive=True):
        try:
            if all(w in " ".join(child.cmdline()) for w in words) and "python" in child.cmdline()[0]:
                return child
        except psutil.NoSuchProcess:
            continue
    return None


def test_a_stage_stopped_by_sigterm_saves_a_checkpoint_and_is_planned_again(finished, tmp_path):
    """The reported fault: the SFT learning rate changed, `dicepipe sft` killed mid-run under
    Snakemake (SIGTERM, as a scheduler's time limit sends). Snakemake removes models/sft/tiny
    and records it as made under the new params; the next plan of the same command (a named
    target) must still run sft and everything made from it, saying why."""
    ws = tmp_path / "ws"
    shutil.copytree(finished, ws, symlinks=True)
    _edit_params(ws, lambda p: p["sft"]["overrides"]["tiny"].update(learning_rate=0.002))
    run = subprocess.Popen([BIN / "snakemake", "--cores", "1", "--", TARGET], cwd=ws, env=_env(ws),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    steps = ws / "models/sft/tiny.work/steps.tsv"
    deadline = time.monotonic() + 120
    while not (steps.is_file() and len(steps.read_text().splitlines()) >= 3):
        assert run.poll() is None and time.monotonic() < deadline, run.communicate()[0][-3000:]
        time.sleep(0.2)
    stage = _descendant(run, "dicepipe", "sft")
    assert stage is not None
    stage.send_signal(signal.SIGTERM)
    output = run.communicate(timeout=120)[0]
    assert run.returncode != 0

    log = (ws / "logs/sft/tiny.log").read_text()
    stopped = re.search(r"stopped by SIGTERM after step (\d+): checkpoint saved in models/sft/tiny.work", log)
    assert stopped, log[-2000:]
    latest = json.loads((ws / "models/sft/tiny.work/latest.json").read_text())
    assert latest["step"] == int(stopped.group(1)) >= 2
    assert not (ws / "models/sft/tiny").exists(), output[-2000:]

    plan = _run([BIN / "snakemake", "-n", "--cores", "1", "--", TARGET], ws)
    assert plan.returncode == 0, plan.stderr[-2000:]
    assert _plan(plan) == {"sft", "rl_infill", "rl_e2e", "evaluate"}
    assert "Nothing to be done" not in plan.stdout
    assert ("dicepipe: models/sft/tiny (and 2 more of its outputs) is missing, though an earlier "
            "run made it") in plan.stderr


def test_params_compare_by_value_and_check_params_requires_what_the_rules_read(finished):
    ws = finished
    original = (ws / "params.yaml").read_text()
    try:
        def reorder(params):
            section = params["assemble"]
            assert section.pop("seed") == 0  # the schema's default
            params["assemble"] = dict(reversed(list(section.items())))

        _edit_params(ws, reorder)
        plan = _run([BIN / "snakemake", "-n", "--cores", "1"], ws)
        # provenance records params.yaml's bytes and sha256: it alone runs again (seconds)
        assert plan.returncode == 0 and _plan(plan) == {"provenance"}, plan.stdout[-2000:]

        (ws / "params.yaml").write_text(original)
        _edit_params(ws, lambda p: p.pop("evaluate"))
        expected = "key '<top level>' is missing the required keys ['evaluate']"
        check = _run([BIN / "dicepipe", "check-params"], ws)
        assert check.returncode != 0 and expected in check.stderr, check.stderr
        plan = _run([BIN / "snakemake", "-n", "--cores", "1"], ws)
        assert plan.returncode != 0 and expected in plan.stdout + plan.stderr
    finally:
        (ws / "params.yaml").write_text(original)


def test_a_hand_placed_input_is_checked_and_one_run_at_a_time_writes_a_folder(finished, tmp_path):
    ws = tmp_path / "ws"
    shutil.copytree(finished, ws, symlinks=True)
    # 1. a wrong file where the offline message of acquire@CuKe says to put it: the stage
    # that reads it (both runners run this command) refuses with acquire's own message
    placed = ws / "data/external/CuKe/CuKe_dataset.json"
    placed.parent.mkdir(parents=True)
    placed.write_text("[]")
    ingest = _run([BIN / "dicepipe", "ingest", "--corpus", "concur", "--out", tmp_path / "s.parquet",
                   "--report", tmp_path / "r.json"], ws)
    assert ingest.returncode == 2
    from dicepipe.acquisition import git_blob_id

    assert (f"data/external/CuKe/CuKe_dataset.json is already there with git_blob "
            f"{git_blob_id(placed)}, expected d08886353a362f065dcb8774635fa28f7f194cf2 "
            "(params.yaml acquire.CuKe.files[0].git_blob") in ingest.stderr
    assert not (tmp_path / "s.parquet").exists()

    # 2. a Snakemake run holds the folder (its stage a stand-in that waits)
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "dicepipe").write_text("#!/bin/sh\nexec sleep 120\n")
    (fake / "dicepipe").chmod(0o755)
    env = _env(ws, PATH=f"{fake}{os.pathsep}{BIN}{os.pathsep}{os.environ['PATH']}")
    command = ["snakemake", "--cores", "1", "--forcerun", "sft", "--", "models/sft/tiny"]
    holder = subprocess.Popen([BIN / command[0], *command[1:]], cwd=ws, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        rwlock = ws / ".dvc/tmp/rwlock"
        deadline = time.monotonic() + 60
        while f'"pid": {holder.pid}' not in (rwlock.read_text() if rwlock.is_file() else "") \
                or _descendant_shell(holder) is None:
            assert holder.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        named = f"`{' '.join(command)}` (pid {holder.pid}) is running in this folder"
        second = _run([BIN / "snakemake", "-n", "--cores", "1"], ws)
        assert second.returncode != 0 and named in second.stdout + second.stderr
        assert "--unlock" not in second.stdout + second.stderr
        dvc = _run([BIN / "dvc", "repro", "assemble@seed"], ws)
        assert dvc.returncode != 0
        assert f"(PID {holder.pid}): {' '.join(command)}" in dvc.stdout + dvc.stderr
        assert (ws / "data/cuke/seed/sft.parquet").is_file()  # DVC deleted nothing
    finally:
        children = psutil.Process(holder.pid).children(recursive=True)
        holder.kill()  # SIGKILL: its locks stay behind
        holder.wait()
        for child in children:
            child.kill()
    # 3. the dead run's lock (and Snakemake's own) is taken over with a note
    after = _run([BIN / "snakemake", "--cores", "1", "--", "data/cuke/seed/sft.parquet"], ws)
    assert after.returncode == 0, after.stderr[-2000:]
    assert f"the lock of `{' '.join(command)}` (pid {holder.pid}), which is no longer running, " \
           "was taken over" in after.stderr
    assert "Snakemake's own locks it left (.snakemake/locks) were removed" in after.stderr


def _descendant_shell(proc: subprocess.Popen):
    """The holder's job has started (its stage is running)."""
    return next((c for c in psutil.Process(proc.pid).children(recursive=True)
                 if "sleep" in " ".join(c.cmdline())), None)
