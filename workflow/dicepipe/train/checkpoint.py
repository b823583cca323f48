"""Resumable training checkpoints: model and optimizer through torch.distributed.checkpoint
(sharded under FSDP, one file in a single process), written to a temporary folder and
renamed, with `latest.json` naming the newest complete one. Everything else a step needs
(data order, noise, learning rate) is a function of the step number, so a resumed run
repeats exactly what an uninterrupted one would have done. What the run has measured so far
(wall time, the steps it resumed at, the loop's own state) travels in the same folder as
`progress.json`, so it always matches the weights it is restored with.

Each checkpoint carries MANIFEST.json (model/manifest.py: every file's size and sha256,
written last, before the rename), and the two newest are kept. A resume checks the newest
against its manifest first; a damaged one is named in the log and removed, and the run
resumes from the one before it, or starts again from step 0 when none is whole. Before
writing, the disk is asked for room for the whole checkpoint: a full disk stops the stage
with the path and the space needed, the checkpoints already there untouched."""

from __future__ import annotations

import json
import logging
import shutil
import warnings
from pathlib import Path

import torch

from ..model.manifest import (
    MANIFEST,
    folder_files,
    free_bytes,
    is_out_of_space,
    listed_problems,
    no_space_error,
    sha256_file,
    space_needed,
    tensor_bytes,
    write_manifest,
)
from .optim import init_optimizer_state
from .parallel import DistEnv, all_reduce_sum, barrier

log = logging.getLogger(__name__)
LATEST = "latest.json"
PROGRESS = "progress.json"
KEEP = 2  # checkpoints kept: a damaged newest one falls back to the one before
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


def _steps(work_dir: Path) -> list[tuple[int, Path]]:
    """The complete checkpoints in `work_dir` (renamed into place), newest first."""
    found = []
    for folder in Path(work_dir).glob("step-*"):
        if folder.is_dir() and not folder.name.endswith(".tmp"):
            try:
                found.append((int(folder.name.removeprefix("step-")), folder))
            except ValueError:
                continue
    return sorted(found, reverse=True)


def _gather(values: list, env: DistEnv | None) -> list:
    """Every rank's `values`, concatenated in rank order (the list itself in one process)."""
    if env is None or not env.distributed:
        return values
    gathered = [None] * env.world_size
    torch.distributed.all_gather_object(gathered, values)
    return [v for part in gathered for v in part]


def _hashes(folder: Path, env: DistEnv | None) -> dict[str, str]:
    """sha256 of every file in `folder`, the files shared out among the ranks."""
    names = folder_files(folder)
    rank, world = (env.rank, env.world_size) if env is not None and env.distributed else (0, 1)
    mine = [(rel, sha256_file(folder / rel)) for rel in names[rank::world]]
    return dict(_gather(mine, env))


def _ensure_space(work_dir: Path, final: Path, state: dict, env: DistEnv) -> int:
    """Stop every rank before writing when the disk cannot hold one more checkpoint (the
    total of every rank's shards; the old checkpoints stay until the new one is complete)."""
    total = all_reduce_sum(torch.tensor([float(tensor_bytes(state))], dtype=torch.float64,
                                        device=env.device), env)
    needed = space_needed(int(total[0]))
    free = free_bytes(work_dir)
    short = all_reduce_sum(torch.tensor([float(free < needed)], dtype=torch.float64, device=env.device), env)
    if float(short[0]) > 0:
        raise no_space_error(final, needed, free, "training checkpoint")
    return needed


def save_checkpoint(work_dir: Path, step: int, model, optimizer, env: DistEnv, keep: int = KEEP,
                    progress: dict | None = None) -> None:
    """Model and optimizer at `step`, plus `progress` (JSON, the main rank's) beside them and
    MANIFEST.json (every file's size and sha256) written last, before the folder is renamed
    into place. A disk without room for it stops every rank before anything is written."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    work_dir = Path(work_dir)
    final = work_dir / f"step-{step:08d}"
    tmp = work_dir / f"step-{step:08d}.tmp"
    if env.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
    barrier(env)
    state = _state(model, optimizer)
    needed = _ensure_space(work_dir, final, state, env)
    if env.is_main:
        tmp.mkdir(parents=True)
    barrier(env)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "assuming single process" notices
            dcp.save(state, checkpoint_id=str(tmp))
    except (Exception, CheckpointException) as exc:  # torch's short write: "unexpected pos"
        full = is_out_of_space(exc, work_dir, needed)  # while the partial files still hold space
        if env.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        if full:
            raise no_space_error(final, needed, free_bytes(work_dir), "training checkpoint") from exc
        raise
    barrier(env)
    if env.is_main:
        (tmp / PROGRESS).write_text(json.dumps(progress or {}, sort_keys=True) + "\n")
    barrier(env)
    hashes = _hashes(tmp, env)
    if env.is_main:
        write_manifest(tmp, hashes)
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        _point_to(work_dir, step, final)
        _prune(work_dir, keep)
        log.info("checkpoint saved at step %d", step)
    barrier(env)


def _point_to(work_dir: Path, step: int, folder: Path) -> None:
    pointer = work_dir / (LATEST + ".tmp")
    pointer.write_text(json.dumps({"step": step, "folder": folder.name}) + "\n")
    pointer.replace(work_dir / LATEST)


def _prune(work_dir: Path, keep: int) -> None:
    for _step, old in _steps(work_dir)[keep:]:
        shutil.rmtree(old, ignore_errors=True)


def latest_step(work_dir: Path) -> tuple[int, Path] | None:
    """The newest complete checkpoint: the one `latest.json` names, else the newest folder."""
    pointer = Path(work_dir) / LATEST
    try:
        data = json.loads(pointer.read_text())
        folder = Path(work_dir) / data["folder"]
        if folder.is_dir():
            return int(data["step"]), folder
    except (OSError, ValueError, KeyError, TypeError):
        pass
    found = _steps(work_dir)
    return found[0] if found else None


def saved_progress(work_dir: Path) -> dict:
    """The `progress` saved with the latest checkpoint ({} when there is none)."""
    found = latest_step(work_dir)
    if found is None or not (found[1] / PROGRESS).is_file():
        return {}
    return json.loads((found[1] / PROGRESS).read_text())


def kept_progress(work_dir: Path) -> list[dict]:
    """The `progress` of every checkpoint kept in `work_dir` (what a fallback may resume)."""
    out = []
    for _step, folder in _steps(work_dir):
        try:
            out.append(json.loads((folder / PROGRESS).read_text()))
        except (OSError, ValueError):
            continue
    return out


def checkpoint_problems(folder: Path, env: DistEnv | None = None) -> list[str] | None:
    """What is wrong with a checkpoint folder against its manifest (sizes, then every file's
    sha256, shared out among the ranks); [] when whole, None when it has no manifest (written
    before manifests: nothing to check it against)."""
    if not (folder / MANIFEST).is_file():
        return None
    try:
        files = json.loads((folder / MANIFEST).read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return [f"{folder / MANIFEST} does not parse"]
    problems = listed_problems(folder, files)
    if problems:
        return problems
    rank, world = (env.rank, env.world_size) if env is not None and env.distributed else (0, 1)
    mine = [f"{folder / rel} does not match the sha256 its manifest records"
            for rel in sorted(files)[rank::world]
            if sha256_file(folder / rel) != files[rel]["sha256"]]
    return sorted(_gather(mine, env))


def choose_checkpoint(work_dir: Path, env: DistEnv | None = None) -> tuple[int, Path] | None:
    """The newest checkpoint whose files match its manifest. Damaged ones are named in the
    log and removed, `latest.json` then names the one chosen; with none whole, the work
    folder's checkpoints are removed and the log says the stage starts again from step 0."""
    main = env is None or env.is_main
    damaged = []
    chosen = None
    for step, folder in _steps(work_dir):
        problems = checkpoint_problems(folder, env)
        if problems:
            damaged.append((step, folder, problems))
            continue
        if problems is None and main:
            log.warning("%s has no manifest (written by an older dicepipe): resuming from it unchecked",
                        folder)
        chosen = (step, folder)
        break
    if damaged and main:
        for step, folder, problems in damaged:
            log.warning("checkpoint %s (step %d) is damaged: %s; removed", folder, step,
                        "; ".join(problems[:3]))
            shutil.rmtree(folder, ignore_errors=True)
        if chosen is not None:
            _point_to(Path(work_dir), *chosen)
            log.warning("resuming from the previous checkpoint, %s (step %d), instead", chosen[1], chosen[0])
        else:
            (Path(work_dir) / LATEST).unlink(missing_ok=True)
            log.warning("no intact checkpoint is left in %s: the stage starts again from step 0", work_dir)
    if env is not None:
        barrier(env)
    return chosen


def restore_checkpoint(work_dir: Path, model, optimizer, env: DistEnv | None = None) -> int:
    """Load the newest intact checkpoint (`choose_checkpoint`) into model and optimizer;
    return its step (0 if none)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import set_state_dict

    from ..errors import CheckpointError

    found = choose_checkpoint(work_dir, env)
    if found is None:
        return 0
    step, folder = found
    init_optimizer_state(optimizer)
    state = _state(model, optimizer)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(state, checkpoint_id=str(folder))
    except (Exception, CheckpointException) as exc:
        reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(
            f"cannot resume from {folder} ({type(exc).__name__}: {reason}). Remove that folder "
            f"(`rm -r {folder}`) and run the same command again: the stage resumes from the "
            f"checkpoint before it, or starts again from step 0 when there is none.") from exc
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
