"""One lock for a project folder's outputs, which both runners respect: DVC's own.

`dvc repro` takes DVC's repository lock (.dvc/tmp/lock) for the whole run, and for each
stage, before it deletes the stage's outputs, DVC's path lock (.dvc/tmp/rwlock: the
paths being read and written, each with the pid and command line of its holder). A DVC
stage meeting a path that a live process holds stops with "'<path>' is busy, it is being
blocked by: (PID n): <command>", and DVC drops entries whose pid is dead with a note.

The top-level `snakemake` run joins that lock: it holds a write entry on the whole folder
from the moment the Snakefile is read until it exits, so a `dvc repro` started meanwhile
stops before deleting anything, naming it. Before taking it, Snakemake refuses while another
live process holds an entry or DVC's repository lock, naming that run's command and pid
(Snakemake's own lock message, which offers --unlock, is never reached while that pid lives).
An entry whose pid is dead is taken over with a note; if it was a Snakemake run, Snakemake's
own lock files (.snakemake/locks), which that run left, are removed with it. Cluster jobs,
which read the Snakefile again, take nothing: only the top-level process does. In a folder
that is no DVC project the same file lives under .snakemake/dicepipe/.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import os
import shlex
import shutil
import sys
import time
from pathlib import Path

from .errors import DicepipeError

RWLOCK = "rwlock"
GUARD = "rwlock.lock"
DVC_REPO_LOCK = Path(".dvc/tmp/lock")
SNAKEMAKE_LOCKS = Path(".snakemake/locks")
GUARD_TIMEOUT_S = 10.0


class RunLockError(DicepipeError):
    """Another run is writing this folder's outputs."""


def lock_dir(root: Path) -> Path:
    """DVC's tmp folder in a DVC project, else one beside Snakemake's records."""
    return root / ".dvc" / "tmp" if (root / ".dvc").is_dir() else root / ".snakemake" / "dicepipe"


def command_line(argv: list[str] | None = None) -> str:
    argv = list(sys.argv if argv is None else argv)
    return shlex.join([Path(argv[0]).name, *argv[1:]]) if argv else "?"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _own_pids() -> set[int]:
    """This process and its ancestors: a run started from inside the holder is part of it."""
    pids, pid = {os.getpid()}, os.getppid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            pid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return pids


def _cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return command_line([a.decode(errors="replace") for a in raw.split(b"\0") if a]) if raw else "?"


class _Guard:
    """DVC's guard around edits of the rwlock file (zc.lockfile: an flock on rwlock.lock)."""

    def __init__(self, folder: Path):
        self.path = folder / GUARD

    def __enter__(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fh = open(self.path, "a+")
        deadline = time.monotonic() + GUARD_TIMEOUT_S
        while True:
            try:
                fcntl.flock(self.fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except BlockingIOError:
                if time.monotonic() > deadline:
                    self.fh.close()
                    raise RunLockError(f"{self.path} stayed locked for {GUARD_TIMEOUT_S:.0f} s: "
                                       "another run is starting here; try again.") from None
                time.sleep(0.05)

    def __exit__(self, *exc):
        fcntl.flock(self.fh.fileno(), fcntl.LOCK_UN)
        self.fh.close()


def _read(folder: Path) -> dict:
    try:
        lock = json.loads((folder / RWLOCK).read_text())
    except (OSError, ValueError):
        lock = {}
    return {"read": dict(lock.get("read") or {}), "write": dict(lock.get("write") or {})}


def _write(folder: Path, lock: dict) -> None:
    lock = {mode: entries for mode, entries in lock.items() if entries}
    (folder / RWLOCK).write_text(json.dumps(lock))


def _entries(lock: dict):
    """(mode, path, info) for every entry."""
    for path, info in lock["write"].items():
        yield "write", path, info
    for path, infos in lock["read"].items():
        for info in infos:
            yield "read", path, info


def _drop(lock: dict, mode: str, path: str, info: dict) -> None:
    if mode == "write":
        lock["write"].pop(path, None)
    else:
        lock["read"][path] = [i for i in lock["read"][path] if i != info]
        if not lock["read"][path]:
            del lock["read"][path]


def dvc_repo_holder(root: Path) -> dict | None:
    """{pid, cmd} of the process holding DVC's repository lock, or None."""
    path = root / DVC_REPO_LOCK
    if not path.is_file():
        return None
    with open(path, "a+") as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            text = fh.read().strip()
            pid = int(text) if text.isdigit() else 0
            return {"pid": pid, "cmd": _cmdline(pid) if pid else "dvc"}
        fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
    return None


def _refusal(root: Path, holder: dict, where: str) -> RunLockError:
    return RunLockError(
        f"{root}: `{holder['cmd']}` (pid {holder['pid']}) is running in this folder ({where}); "
        f"a second run would delete and rewrite the same outputs. Wait for it to finish, or "
        f"stop it (`kill {holder['pid']}`: a training stage saves a checkpoint first), then run "
        f"again.")


class RunLock:
    """The folder's lock for one Snakemake run (`take`), or only its check (`check`)."""

    def __init__(self, root: Path | str = ".", cmd: str | None = None, stream=None):
        self.root = Path(root).resolve()
        self.folder = lock_dir(self.root)
        self.info = {"pid": os.getpid(), "cmd": cmd or command_line()}
        self.stream = stream if stream is not None else sys.stderr
        self.held = False

    def check(self) -> None:
        """Refuse while another live run holds the folder; take over dead runs' entries."""
        self._update(take=False)

    def take(self) -> None:
        self._update(take=True)
        self.held = True
        atexit.register(self.release)

    def release(self) -> None:
        if not self.held:
            return
        with _Guard(self.folder):
            lock = _read(self.folder)
            if lock["write"].get(str(self.root)) == self.info:
                del lock["write"][str(self.root)]
            _write(self.folder, lock)
        self.held = False

    def _update(self, take: bool) -> None:
        own = _own_pids()
        with _Guard(self.folder):
            lock = _read(self.folder)
            stale = []
            for mode, path, info in list(_entries(lock)):
                if int(info.get("pid", 0)) in own:
                    continue
                if _alive(int(info.get("pid", 0))):
                    raise _refusal(self.root, info, f"it holds {self.folder / RWLOCK}")
                stale.append(info)
                _drop(lock, mode, path, info)
            holder = dvc_repo_holder(self.root)
            if holder and holder["pid"] not in own:
                raise _refusal(self.root, holder, f"it holds DVC's lock, {DVC_REPO_LOCK}")
            if take:
                lock["write"][str(self.root)] = self.info
            if stale or take:
                _write(self.folder, lock)
        for info in {json.dumps(i, sort_keys=True): i for i in stale}.values():
            self._take_over(info)

    def _take_over(self, info: dict) -> None:
        note = (f"dicepipe: the lock of `{info.get('cmd')}` (pid {info.get('pid')}), which is no "
                f"longer running, was taken over ({self.folder / RWLOCK})")
        locks = self.root / SNAKEMAKE_LOCKS
        if str(info.get("cmd", "")).startswith("snakemake") and locks.is_dir() and any(locks.iterdir()):
            shutil.rmtree(locks, ignore_errors=True)
            note += f"; Snakemake's own locks it left ({SNAKEMAKE_LOCKS}) were removed"
        print(note + ".", file=self.stream)


def for_snakemake(workflow) -> RunLock | None:
    """Called while the Snakefile is read: the top-level `snakemake` command takes the lock
    (until it exits); a dry run, a run through the API and the top-level process of any
    other program only check it; cluster jobs do nothing."""
    if not workflow.is_main_process:
        return None
    lock = RunLock(".")
    dry = bool(getattr(workflow.output_settings, "dryrun", False))
    if dry or not Path(sys.argv[0]).name.startswith("snakemake"):
        lock.check()
    else:
        lock.take()
    return lock
