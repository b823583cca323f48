"""Every entry of the build cache and of the resume stores checked against its hash, and the
damaged or orphaned ones removed (`dicepipe cache verify` / `dicepipe cache prune`).

What is an entry, and how it is checked, is compilation/entries.py's (the build cache) and
results.py's (a stored row). Orphans are what no reader will ever use: a build's temporary
folder whose builder is gone, a half-written temporary file older than ORPHAN_AGE_S, a hash
whose entry is gone. Locks, CPU slots and "seen"/"failed" markers are left alone. Pruning
while a run uses the cache is safe: a removed entry is made again by the next build that
needs it, and a resume file busy with its writer is skipped (named in the summary).
"""

from __future__ import annotations

import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from .compilation.entries import (
    HASHES,
    bytes_digest,
    check_build_folder,
    check_file,
    discard,
    label,
    unhashed,
    unsealed,
)
from .errors import HarnessError
from .results import ResultStore

ORPHAN_AGE_S = 600.0
# a temporary name: `<name>.<pid>`, `<name>.<pid>.tmp`, `<name>.<pid>.<ns>.tmp`
_TEMPORARY = re.compile(r"\.(\d+)(?:\.\d+)?(?:\.tmp)?$|\.tmp$")
_HASHED = {"host-objects": (".o", ".fail"), "pch": (".gch",), "pch-cuda-host": (".gch", ".h")}


@dataclass
class Finding:
    path: Path
    what: str  # "damaged" | "orphaned" | "unhashed" (made before entries carried hashes)
    why: str


@dataclass
class CacheReport:
    """What a check found: entries checked, and each damaged or orphaned one."""

    root: Path
    checked: int = 0
    findings: list[Finding] = field(default_factory=list)
    busy: list[str] = field(default_factory=list)  # resume files another run is writing

    def add(self, path: Path, what: str, why: str) -> None:
        self.findings.append(Finding(Path(path), what, why))

    def count(self, what: str) -> int:
        return sum(f.what == what for f in self.findings)

    @property
    def problems(self) -> list[Finding]:
        """The damaged and the orphaned (an unhashed entry is neither: it is only old)."""
        return [f for f in self.findings if f.what != "unhashed"]

    def lines(self, title: str, unit: str = "entries") -> list[str]:
        head = (f"{title} {self.root}: {self.checked} {unit} checked, "
                f"{self.count('damaged')} damaged, {self.count('orphaned')} orphaned")
        if self.count("unhashed"):
            head += (f", {self.count('unhashed')} made before entries carried a hash (rebuilt "
                     "when next used)")
        out = [head]
        out += [f"  {f.what}: {label(self.root, f.path)} ({f.why})" for f in self.problems]
        out += [f"  skipped (another run is writing it): {name}" for name in self.busy]
        return out

    def add_damage(self, path: Path, damage: str) -> None:
        self.add(path, "unhashed" if unhashed(damage) else "damaged", damage)


def _pid_gone(pid: int) -> bool:
    return pid != os.getpid() and not os.path.exists(f"/proc/{pid}")


def _old(path: Path) -> bool:
    try:
        return time.time() - path.lstat().st_mtime > ORPHAN_AGE_S
    except OSError:
        return False


def check_build_cache(cache: Path) -> CacheReport:
    """Every entry of a build cache folder: built extensions (status.json and the module
    against the hashes in it), precompiled headers, preludes, shared host objects and
    compiler errors (against their recorded hashes), extraction records; and orphans."""
    report = CacheReport(cache)
    if not cache.is_dir():
        return report
    for folder in sorted((cache / "ext").glob("*/*")):
        if folder.is_dir():
            report.checked += 1
            _status, damage = check_build_folder(folder)
            if damage:
                report.add_damage(folder, damage)
    for top, suffixes in _HASHED.items():
        for path in sorted((cache / top).rglob("*")):
            if path.is_file() and not path.is_symlink() and path.name.endswith(suffixes) \
                    and not _TEMPORARY.search(path.name):
                _check_hashed(cache, path, report)
    for path in sorted((cache / "preludes").rglob("*")):
        if not path.is_file() or _TEMPORARY.search(path.name):
            continue
        if path.suffix == ".h":  # named by the digest of its text
            report.checked += 1
            if bytes_digest(path.read_bytes())[:len(path.stem)] != path.stem:
                report.add(path, "damaged", "its text does not match the digest in its name")
        elif path.parent.name.endswith(".h.gch"):  # a precompiled prelude
            _check_hashed(cache, path, report)
    _check_extraction(cache, report)
    _find_orphans(cache, report)
    return report


def _check_hashed(cache: Path, path: Path, report: CacheReport) -> None:
    report.checked += 1
    damage = check_file(cache, path)
    if damage:
        report.add_damage(path, damage)


def _check_extraction(cache: Path, report: CacheReport) -> None:
    for path in sorted((cache / "extract").rglob("*.json")):
        report.checked += 1
        try:
            _record, damage = unsealed(path.read_text())
        except OSError as exc:
            damage = f"unreadable: {exc}"
        if damage and not unhashed(damage):  # an old record is extracted again, unreported
            report.add(path, "damaged", damage)


def _find_orphans(cache: Path, report: CacheReport) -> None:
    for entry in sorted((cache / "tmp").glob("*")):
        parts = entry.name.split(".")
        if len(parts) >= 3 and parts[1].isdigit() and _pid_gone(int(parts[1])):
            report.add(entry, "orphaned", "temporary build folder of a builder that is gone")
        elif ".damaged." in entry.name and _old(entry):
            report.add(entry, "orphaned", "a damaged entry set aside and not yet removed")
    for path in sorted(cache.rglob("*")):
        if path.is_file() and cache / "tmp" not in path.parents \
                and _TEMPORARY.search(path.name) and _old(path):
            report.add(path, "orphaned", "half-written temporary file of a run that is gone")
    hashes = cache / HASHES
    for path in sorted(hashes.rglob("*.sha256")):
        entry = cache / str(path.relative_to(hashes))[:-len(".sha256")]
        if not entry.exists() and not _TEMPORARY.search(path.name):
            report.add(path, "orphaned", "hash of an entry that is gone")


def check_resume_stores(folder: Path) -> CacheReport:
    """Every row of every resume store under `folder` against its hash."""
    report = CacheReport(folder)
    for path in _stores(folder):
        store = ResultStore(path, writable=False)
        report.checked += len(store.rows) + len(store.damaged)
        for job_id in store.damaged:
            report.add(path, "damaged", f"row {job_id} does not match its hash")
    if folder.is_dir():
        for path in sorted(folder.rglob("*.tmp")):
            if _old(path):
                report.add(path, "orphaned", "half-written results file of a run that is gone")
    return report


def _stores(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    found = {p for p in folder.rglob("*.parquet")}
    found |= {p.with_name(p.name[:-len(".journal.jsonl")])
              for p in folder.rglob("*.parquet.journal.jsonl")}
    return sorted(found)


def prune_build_cache(cache: Path, report: CacheReport) -> None:
    """Remove what `report` found (a damaged entry is made again when next needed)."""
    for finding in report.findings:
        if finding.path.is_dir() and finding.path.parent == cache / "tmp":
            shutil.rmtree(finding.path, ignore_errors=True)
        elif finding.path.is_relative_to(cache / HASHES):
            finding.path.unlink(missing_ok=True)
        else:
            discard(cache, finding.path)


def prune_resume_stores(report: CacheReport) -> int:
    """Rewrite each resume file with damaged rows without them (its writer's lock held, so
    a file another run is writing is skipped, and named), and remove orphans. Returns how
    many rows were dropped."""
    damaged = sorted({f.path for f in report.findings if f.what == "damaged"})
    dropped = 0
    for path in damaged:
        try:
            store = ResultStore(path, wait_s=0.0)
        except HarnessError:
            report.busy.append(label(report.root, path))
            continue
        dropped += len(store.damaged)
        try:
            store.flush()  # the rows that match their hashes, each with its hash
            store.journal_path.unlink(missing_ok=True)
        finally:
            store.close()
    for finding in report.findings:
        if finding.what == "orphaned":
            finding.path.unlink(missing_ok=True)
    return dropped
