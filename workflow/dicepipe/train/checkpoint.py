"""Resumable training checkpoints: model and optimizer through torch.distributed.checkpoint
(sharded under FSDP, one file in a single process), written to a temporary folder and
renamed, with `latest.json` naming the newest complete one. Everything else a step needs
(data order, noise, learning rate) is a function of the step number, so a resumed run
repeats exactly what an uninterrupted one would have done. What the run has measured so far
(wall time, the steps it resumed at, the loop's own state) travels in the same folder as
`progress.json`, so it always matches the weights it is restored with."""

from __future__ import annotations

import json
import logging
import shutil
import warnings
from pathlib import Path

import torch

from .optim import init_optimizer_state
from .parallel import DistEnv, barrier

log = logging.getLogger(__name__)
LATEST = "latest.json"
PROGRESS = "progress.json"


FINGERPRINT = "fingerprint.txt"


def claim_work_dir(work_dir: Path, fingerprint: str, env: DistEnv) -> None:
    """Keep the checkpoints in `work_dir` only if they belong to this very run (same
    settings, data, model and ranks); otherwise clear them, so that a leftover from a killed
    run with other parameters is never resumed."""
    work_dir = Path(work_dir)
    if env.is_main:
        marker = work_dir / FINGERPRINT
        if work_dir.exists() and (not marker.is_file() or marker.read_text().strip() != fingerprint):
            if latest_step(work_dir) is not None:
                log.warning("%s holds checkpoints of a different run; starting afresh", work_dir)
            shutil.rmtree(work_dir)
        work_dir.mkdir(parents=True, exist_ok=True)
        marker.write_text(fingerprint + "\n")
    barrier(env)


def _state(model, optimizer):
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optim": optim_state}


def save_checkpoint(work_dir: Path, step: int, model, optimizer, env: DistEnv, keep: int = 1,
                    progress: dict | None = None) -> None:
    """Model and optimizer at `step`, plus `progress` (JSON, the main rank's) beside them."""
    import torch.distributed.checkpoint as dcp

    work_dir = Path(work_dir)
    final = work_dir / f"step-{step:08d}"
    tmp = work_dir / f"step-{step:08d}.tmp"
    if env.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    barrier(env)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "assuming single process" notices
        dcp.save(_state(model, optimizer), checkpoint_id=str(tmp))
    barrier(env)
    if env.is_main:
        (tmp / PROGRESS).write_text(json.dumps(progress or {}, sort_keys=True) + "\n")
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        pointer = work_dir / (LATEST + ".tmp")
        pointer.write_text(json.dumps({"step": step, "folder": final.name}) + "\n")
        pointer.replace(work_dir / LATEST)
        _prune(work_dir, keep)
        log.info("checkpoint saved at step %d", step)
    barrier(env)


def _prune(work_dir: Path, keep: int) -> None:
    folders = sorted(p for p in work_dir.glob("step-*") if p.is_dir() and not p.name.endswith(".tmp"))
    for old in folders[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def latest_step(work_dir: Path) -> tuple[int, Path] | None:
    pointer = Path(work_dir) / LATEST
    if not pointer.is_file():
        return None
    data = json.loads(pointer.read_text())
    folder = Path(work_dir) / data["folder"]
    return (int(data["step"]), folder) if folder.is_dir() else None


def saved_progress(work_dir: Path) -> dict:
    """The `progress` saved with the latest checkpoint ({} when there is none)."""
    found = latest_step(work_dir)
    if found is None or not (found[1] / PROGRESS).is_file():
        return {}
    return json.loads((found[1] / PROGRESS).read_text())


def restore_checkpoint(work_dir: Path, model, optimizer) -> int:
    """Load the latest checkpoint into model and optimizer; return its step (0 if none)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    found = latest_step(work_dir)
    if found is None:
        return 0
    step, folder = found
    init_optimizer_state(optimizer)
    state = _state(model, optimizer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, checkpoint_id=str(folder))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    log.info("resumed from %s (step %d)", folder, step)
    return step


def full_model_state(model, env: DistEnv) -> dict[str, torch.Tensor] | None:
    """The whole model's state dict on CPU on rank 0 (None elsewhere), keys without the
    training wrapper's `lm.` prefix (the transformers model's own names)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = get_model_state_dict(model, options=options)
    if not env.is_main:
        return None
    return {k.removeprefix("lm."): v for k, v in state.items()}
