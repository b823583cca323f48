"""Whole folders or a named error: the manifest a model or checkpoint folder is written with,
its check before a stage reads the folder, and the free-space check before one is written.

`MANIFEST.json`, written last into a folder's temporary copy, before the rename that puts
the folder in place: `{"format": 1, "files": {"<relative path>": {"bytes": N, "sha256":
"<hex>"}}}`, sorted keys, no times or paths, so two identical folders have identical
manifests. It is the table an acquired folder records in `ACQUIRED.json` (`files`), and the
check reads either the same way.

What a read checks (`check_model_folder`):
- every file the manifest lists is there with its size; every safetensors file's header is
  whole and its tensors end where the file ends; the folder's JSON files parse;
- the sha256 of every listed file: on every read for folders up to `HASH_EVERY_READ_BYTES`
  (the tiny models: milliseconds); a larger folder (an acquired 8B base, 16 GB) is hashed on
  its first read and stamped under `.cache/dicepipe/verified/`, keyed by each file's size,
  modification time and inode: a file replaced or rewritten is hashed again, and one damaged
  in place without a new modification time is caught by its size and header only;
- a folder without a manifest (written before manifests existed, the shipped base, a hub
  snapshot): sizes against the safetensors headers, the shards an index names, JSON files.

A damaged folder is a CheckpointError that names the file, what is wrong with it, the stage
that writes the folder and the command that writes it again.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import shutil
import subprocess
from pathlib import Path

from ..errors import CheckpointError

log = logging.getLogger(__name__)

MANIFEST = "MANIFEST.json"
ACQUIRED = "ACQUIRED.json"  # an acquired folder's record (acquisition.py): the same `files` table
HASH_EVERY_READ_BYTES = 1 << 30  # larger folders are hashed once, then stamped
STAMP_DIR = Path(".cache/dicepipe/verified")  # relative to the repository root, where stages run
_CHUNK = 8 << 20
_MAX_HEADER = 100_000_000  # safetensors' own limit on a header


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def folder_files(folder: Path) -> list[str]:
    """Every file under `folder` (relative, sorted), the manifest itself left out."""
    folder = Path(folder)
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                  if p.is_file() and p.name != MANIFEST)


def write_manifest(folder: Path, hashes: dict[str, str] | None = None) -> dict:
    """Write `folder`'s MANIFEST.json (atomically) from its files as they are now; `hashes`
    (relative path -> sha256) are used where given, the rest are hashed here."""
    folder = Path(folder)
    hashes = hashes or {}
    files = {rel: {"bytes": (folder / rel).stat().st_size,
                   "sha256": hashes.get(rel) or sha256_file(folder / rel)}
             for rel in folder_files(folder)}
    manifest = {"format": 1, "files": files}
    tmp = folder / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    tmp.replace(folder / MANIFEST)
    return manifest


def read_manifest(folder: Path) -> tuple[str, dict] | None:
    """(file name, its `files` table) of the folder's MANIFEST.json, else of ACQUIRED.json;
    None when it has neither. A MANIFEST.json that does not parse raises ValueError."""
    for name in (MANIFEST, ACQUIRED):
        path = Path(folder) / name
        if not path.is_file():
            continue
        try:
            files = json.loads(path.read_text())["files"]
            if not isinstance(files, dict):
                raise TypeError
        except (ValueError, KeyError, TypeError) as exc:
            if name == ACQUIRED:  # a record without a files table (a git archive): no manifest
                return None
            raise ValueError(f"{path} is not a readable manifest ({type(exc).__name__})") from exc
        return name, files
    return None


def listed_problems(folder: Path, files: dict) -> list[str]:
    """What is wrong with the files a manifest lists, sizes only (no hashing)."""
    problems = []
    for rel, record in sorted(files.items()):
        path = Path(folder) / rel
        if not path.is_file():
            problems.append(f"{path} is missing")
        elif path.stat().st_size != record["bytes"]:
            problems.append(f"{path} has {path.stat().st_size:,} bytes, its manifest says "
                            f"{record['bytes']:,} (cut short or overwritten)")
    return problems


def hash_problems(folder: Path, files: dict, names: list[str]) -> list[str]:
    return [f"{Path(folder) / rel} does not match the sha256 its manifest records (damaged)"
            for rel in names if sha256_file(Path(folder) / rel) != files[rel]["sha256"]]


def safetensors_problem(path: Path) -> str | None:
    """Whether a safetensors file is whole: its header parses and its last tensor ends where
    the file does (a file cut short fails here, for the cost of reading its header)."""
    size = path.stat().st_size
    if size < 8:
        return f"{path} has {size} bytes, too few for a safetensors header (cut short)"
    with open(path, "rb") as fh:
        length = int.from_bytes(fh.read(8), "little")
        if length > min(size - 8, _MAX_HEADER):
            return (f"{path} has {size:,} bytes but its header alone says {length:,}: "
                    "cut short or not a safetensors file")
        try:
            header = json.loads(fh.read(length))
            end = max((int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"),
                      default=0)
        except (ValueError, KeyError, TypeError, AttributeError, IndexError):
            return f"{path} has a safetensors header that does not parse (damaged)"
    if 8 + length + end != size:
        return (f"{path} has {size:,} bytes where its header needs {8 + length + end:,} "
                f"({'cut short' if size < 8 + length + end else 'extra bytes at its end'})")
    return None


def structure_problems(folder: Path) -> list[str]:
    """What headers and sizes alone show: safetensors files, an index's shards, JSON files."""
    folder = Path(folder)
    problems = []
    for path in sorted(folder.glob("*.json")):
        if path.name.endswith(".tmp") or path.stat().st_size > 64 << 20:
            continue
        try:
            json.loads(path.read_text())
        except (ValueError, UnicodeDecodeError):
            problems.append(f"{path} is not valid JSON (cut short or overwritten)")
    for index in sorted(folder.glob("*.safetensors.index.json")):
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (ValueError, KeyError, AttributeError, UnicodeDecodeError):
            continue  # reported above when it does not parse
        problems += [f"{folder / shard} is missing (named by {index.name})" for shard in sorted(shards)
                     if not (folder / shard).is_file()]
    for path in sorted(folder.glob("*.safetensors")):
        found = safetensors_problem(path)
        if found:
            problems.append(found)
    for path in sorted(folder.glob("*.bin")):
        if path.stat().st_size == 0:
            problems.append(f"{path} is empty")
    return problems


def _stamp_path(folder: Path) -> Path:
    key = hashlib.sha256(str(Path(folder).resolve()).encode()).hexdigest()[:24]
    return STAMP_DIR / f"{key}.json"


def _file_key(path: Path) -> list[int]:
    stat = path.stat()
    return [stat.st_size, stat.st_mtime_ns, stat.st_ino, stat.st_dev]


def _read_stamp(folder: Path) -> dict:
    try:
        return json.loads(_stamp_path(folder).read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def stamp_verified(folder: Path, files: dict, names: list[str] | None = None) -> None:
    """Record that `names` (default: every listed file) match their manifest as they are now."""
    stamp = _read_stamp(folder)
    for rel in files if names is None else names:
        stamp[rel] = {"key": _file_key(Path(folder) / rel), "sha256": files[rel]["sha256"]}
    path = _stamp_path(folder)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # ranks may stamp at once
        tmp.write_text(json.dumps({"folder": str(Path(folder).resolve()), "files": stamp},
                                  sort_keys=True) + "\n")
        tmp.replace(path)
    except OSError as exc:  # a read-only checkout: hashed again next time
        log.debug("cannot stamp %s as verified: %s", folder, exc)


def folder_problems(folder: Path) -> list[str]:
    """Everything wrong with a model folder that its manifest, sizes and headers show."""
    folder = Path(folder)
    try:
        found = read_manifest(folder)
    except ValueError as exc:
        return [str(exc)]
    problems = structure_problems(folder)
    if found is None:
        return problems
    _name, files = found
    listed = listed_problems(folder, files)
    named = [f"{folder / rel} " for rel in files if any(p.startswith(f"{folder / rel} ") for p in listed)]
    problems = listed + [p for p in problems if not p.startswith(tuple(named))]
    if problems:
        return problems
    if sum(r["bytes"] for r in files.values()) <= HASH_EVERY_READ_BYTES:
        return hash_problems(folder, files, sorted(files))
    stamp = _read_stamp(folder)
    unstamped = [rel for rel in sorted(files)
                 if stamp.get(rel, {}).get("key") != _file_key(folder / rel)
                 or stamp.get(rel, {}).get("sha256") != files[rel]["sha256"]]
    if unstamped:
        log.info("%s: checking %d file(s) against %s once (then stamped)", folder, len(unstamped),
                 found[0])
    problems = hash_problems(folder, files, unstamped)
    if not problems and unstamped:
        stamp_verified(folder, files, unstamped)
    return problems


def rebuild_hint(folder: Path) -> str:
    """What writes `folder` again: its stage and command under both runners, `git checkout`
    for a folder shipped with the repository, a new download for a hub snapshot."""
    from ..data.schema import DVC_FILES, producing_stage, remake_command

    folder = Path(folder)
    if any(producing_stage(folder, dvc_file) for dvc_file in DVC_FILES):
        return remake_command(folder)
    hub = next((part for part in folder.parts if part.startswith("models--")), None)
    if hub is not None:
        repo_id = "/".join(hub.split("--")[1:])
        return (f"It is a hub snapshot: download it again (`hf download {repo_id} --force-download`, "
                "with the revision params.yaml names).")
    if _tracked_by_git(folder):
        return f"It is shipped with the repository: `git checkout -- {folder}` restores it."
    return remake_command(folder)


def _tracked_by_git(folder: Path) -> bool:
    try:
        listed = subprocess.run(["git", "ls-files", "--", str(folder)], capture_output=True, text=True,
                                timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return False
    return listed.returncode == 0 and bool(listed.stdout.strip())


def check_model_folder(folder: Path) -> None:
    """Raise CheckpointError naming the damage, the stage and the command when `folder` is
    not whole (see the module's docstring for what is checked)."""
    problems = folder_problems(folder)
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise CheckpointError(f"model folder {folder} is damaged: {'; '.join(problems[:3])}{more}. "
                              f"{rebuild_hint(folder)}")


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 26 else f"{n / (1 << 20):.1f} MiB"


def space_needed(payload_bytes: int) -> int:
    """What writing `payload_bytes` asks of a disk: the bytes, 5% and 16 MiB for metadata."""
    return int(payload_bytes * 1.05) + (16 << 20)


def free_bytes(path: Path) -> int:
    """Free bytes on the disk that holds `path` (or would: its nearest existing parent)."""
    probe = Path(path).absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def space_short(path: Path, needed: int) -> int | None:
    """The free bytes where `path` will be written when fewer than `needed`, else None."""
    free = free_bytes(path)
    return free if free < needed else None


def no_space_error(path: Path, needed: int, free: int, what: str) -> CheckpointError:
    return CheckpointError(
        f"no space left for the {what} at {path}: it needs about {_gib(needed)}, the disk "
        f"holding it has {_gib(free)} free. Nothing was written and nothing earlier was removed; "
        "free space on that disk and run the same command again: the stage resumes from its last "
        "checkpoint.")


def ensure_space(path: Path, payload_bytes: int, what: str) -> None:
    """Raise CheckpointError before writing when the disk at `path` cannot hold `payload_bytes`."""
    needed = space_needed(payload_bytes)
    free = space_short(path, needed)
    if free is not None:
        raise no_space_error(path, needed, free, what)


def is_out_of_space(exc: BaseException, path: Path, needed: int) -> bool:
    """Whether a failed write is a full disk: ENOSPC, or a library's own wording of a short
    write (torch: "unexpected pos") with the disk now short of what the write needed."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    try:
        return space_short(path, needed) is not None
    except OSError:
        return False


def tensor_bytes(state) -> int:
    """Bytes of every tensor in a nested state dict (a sharded tensor: this rank's shard)."""
    import torch

    if isinstance(state, dict):
        return sum(tensor_bytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(tensor_bytes(v) for v in state)
    if isinstance(state, torch.Tensor):
        local = state.to_local() if hasattr(state, "to_local") else state
        return local.numel() * local.element_size()
    return 0

