"""Content hashes of build-cache entries: written with each entry, checked before its use.

Two forms, both written so that an entry is never visible without its hash:
- a build folder (`ext/<key>`) and an extraction record carry their hashes inside their own
  JSON: `status.json` lists the sha256 of each file it vouches for (the built module) and the
  sha256 of its own other fields, and the folder is renamed into place whole;
- any other file (a precompiled header, a shared host object, a shared compiler error) has a
  sidecar `hashes/<its path in the cache>.sha256`, written before the file itself is renamed
  into place. The sidecars live in their own tree, not beside the entry: gcc reads every file
  of a `.gch` folder as a candidate header.
A prelude is named by the digest of its text, which is its hash.

A check answers None (healthy) or the reason the entry cannot be trusted. Stdlib only: the
device worker checks a build before importing it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import time
from pathlib import Path

HASHES = "hashes"
DIGEST_FIELD = "sha256"
NO_HASH = "no content hash (made before cache entries carried one)"


def unhashed(damage: str | None) -> bool:
    """An entry made before entries carried hashes: rebuilt like a damaged one (it cannot be
    trusted), but not reported as damage."""
    return bool(damage) and damage.endswith(NO_HASH)


@functools.lru_cache(maxsize=512)
def _digest_of(path: str, size: int, mtime_ns: int, inode: int) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()


def file_digest(path: Path) -> str:
    """sha256 of a file (remembered while its size, time and inode stay the same)."""
    stat = os.stat(path)
    return _digest_of(str(path), stat.st_size, stat.st_mtime_ns, stat.st_ino)


def bytes_digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- JSON that carries its own hash ------------------------------------------------------------

def _fields_digest(record: dict) -> str:
    body = {k: v for k, v in record.items() if k != DIGEST_FIELD}
    return bytes_digest(json.dumps(body, sort_keys=True).encode())


def seal(record: dict) -> dict:
    """`record` with its own hash added (DIGEST_FIELD), to be written as JSON."""
    return dict(record, **{DIGEST_FIELD: _fields_digest(record)})


def unsealed(text: str) -> tuple[dict | None, str | None]:
    """(the record, None) for sealed JSON that matches its hash, else (None, the reason)."""
    try:
        record = json.loads(text)
    except ValueError:
        return None, "not readable JSON"
    if not isinstance(record, dict):
        return None, "not a JSON object"
    if DIGEST_FIELD not in record:
        return None, NO_HASH
    if record[DIGEST_FIELD] != _fields_digest(record):
        return None, "its content does not match its hash"
    return {k: v for k, v in record.items() if k != DIGEST_FIELD}, None


def seal_build(status: dict, folder: Path, files: list[str]) -> dict:
    """A build's status.json content: the sha256 of each of `files` (in `folder`), sealed."""
    hashes = {name: file_digest(folder / name) for name in files if (folder / name).is_file()}
    return seal(dict(status, files=hashes))


def check_build_folder(folder: Path, files: bool = True) -> tuple[dict | None, str | None]:
    """(status, None) for a healthy build folder, (None, None) where there is none, else
    (None, the reason it is damaged). `files=False`: status.json alone is checked."""
    path = folder / "status.json"
    if not folder.exists():
        return None, None
    try:
        text = path.read_text()
    except OSError:
        return None, "status.json is missing"
    status, damage = unsealed(text)
    if damage:
        return None, f"status.json: {damage}"
    hashes = status.get("files")
    if not isinstance(hashes, dict) or (status.get("ok") and not hashes):
        return None, "status.json names no built file"
    for name, digest in (hashes.items() if files else ()):
        file = folder / name
        if not file.is_file():
            return None, f"{name} is missing"
        if file_digest(file) != digest:
            return None, f"{name} does not match its hash (size {file.stat().st_size} bytes)"
    return status, None


# --- files with a sidecar hash -----------------------------------------------------------------

def sidecar(cache: Path, path: Path) -> Path:
    return cache / HASHES / f"{Path(path).relative_to(cache)}.sha256"


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def record_hash(cache: Path, path: Path, digest: str) -> None:
    """Write `path`'s hash; call before `path` is renamed into place."""
    _write_atomic(sidecar(cache, path), digest.encode())


def write_checked(cache: Path, path: Path, data: bytes | str) -> None:
    """Write `path` whole (atomically), its hash first."""
    data = data.encode() if isinstance(data, str) else data
    record_hash(cache, path, bytes_digest(data))
    _write_atomic(path, data)


def check_file(cache: Path, path: Path) -> str | None:
    """None when `path` matches its recorded hash (or is absent), else why it does not."""
    if not path.is_file():
        return None
    try:
        recorded = sidecar(cache, path).read_text().strip()
    except OSError:
        return NO_HASH
    if file_digest(path) != recorded:
        return f"does not match its hash (size {path.stat().st_size} bytes)"
    return None


def read_checked(cache: Path, path: Path) -> tuple[bytes | None, str | None]:
    """(content, None) of a healthy entry, (None, None) of an absent one, (None, reason)."""
    if not path.is_file():
        return None, None
    data = path.read_bytes()
    try:
        recorded = sidecar(cache, path).read_text().strip()
    except OSError:
        return None, NO_HASH
    if bytes_digest(data) != recorded:
        return None, f"does not match its hash (size {len(data)} bytes)"
    return data, None


# Damaged entries this process found and removed since the last build it returned: the
# build's status carries them to the orchestrator, which reports them.
_REPAIRED: list[list[str]] = []


def note_repair(cache: Path, path: Path, damage: str) -> None:
    _REPAIRED.append([label(cache, path), damage])


def taken_repairs() -> list[list[str]]:
    """[entry, why it was damaged] of each entry noted since the last call."""
    taken = list(_REPAIRED)
    del _REPAIRED[:len(taken)]
    return taken


def checked_entry(cache: Path, path: Path) -> bytes | None:
    """A hashed cache file's content, or None: absent, or damaged (then removed and noted,
    to be made again)."""
    data, damage = read_checked(cache, path)
    if damage:
        discard(cache, path)
        if not unhashed(damage):
            note_repair(cache, path, damage)
    return data


def checked_or_removed(cache: Path, path: Path) -> bool:
    """Whether a hashed cache file (read by the compiler, not by us) is there and healthy; a
    damaged one is removed and noted, to be made again."""
    damage = check_file(cache, path)
    if damage:
        discard(cache, path)
        if not unhashed(damage):
            note_repair(cache, path, damage)
        return False
    return path.is_file()


def discard(cache: Path, path: Path) -> None:
    """Remove a damaged entry (a file or a folder) and its sidecar. A folder is first renamed
    out of the way, so no reader ever sees it half removed."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        aside = cache / "tmp" / f"{path.name}.damaged.{os.getpid()}.{time.monotonic_ns()}"
        aside.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(path, aside)
        except OSError:
            return  # gone already (another process removed it)
        shutil.rmtree(aside, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
    sidecar(cache, path).unlink(missing_ok=True)


def label(cache: Path, path: Path) -> str:
    """An entry's name as messages show it: its path inside the cache."""
    try:
        return str(Path(path).relative_to(cache))
    except ValueError:
        return str(path)
