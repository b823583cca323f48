"""Jobs from files: a folder pair whose files pair up by name (reference programs and
candidate kernel files, KernelBench format), or a Parquet file of pairs. A file that cannot
be read is a row with its reason, never the end of a run."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from .errors import HarnessError
from .results import empty_row
from .settings import Job

log = logging.getLogger(__name__)
REFERENCE_COLUMNS = ("reference_code", "reference", "ref_code")
CANDIDATE_COLUMNS = ("candidate_code", "candidate", "kernel_code", "kernel")
ID_COLUMNS = ("job_id", "sample_id", "task_id", "name")


def read_program(path: Path) -> tuple[str | None, str]:
    """A program file's text, or None and why not: one unreadable file is one failed row
    with its reason, never the end of a run."""
    try:
        return path.read_text(encoding="utf-8"), ""
    except UnicodeDecodeError as exc:
        return None, (f"{path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset "
                      f"{exc.start}). Save it as UTF-8 (e.g. `iconv -f latin1 -t utf-8`) and "
                      "run again; the other files were scored.")
    except OSError as exc:
        return None, f"{path}: cannot be read ({exc.strerror}); the other files were scored."


@dataclass
class FolderJobs:
    """What a folder pair gives: jobs to run, rows for files that could not be read, and the
    files of one folder with no partner in the other (named in the summary)."""

    jobs: list
    unreadable: list[dict] = field(default_factory=list)
    no_reference: list[str] = field(default_factory=list)  # candidate files
    no_candidate: list[str] = field(default_factory=list)  # reference files


def load_folder_jobs(references: Path, candidates: Path, backend: str) -> FolderJobs:
    if not references.is_dir():
        raise HarnessError(f"--references {references}: no such folder.")
    if not candidates.is_dir():
        raise HarnessError(f"--candidates {candidates}: no such folder.")
    found = FolderJobs(jobs=[])
    names = {cand.name for cand in candidates.glob("*.py")}
    found.no_candidate = sorted(ref.name for ref in references.glob("*.py")
                                if ref.name not in names)
    for cand in sorted(candidates.glob("*.py")):
        ref = references / cand.name
        if not ref.is_file():
            found.no_reference.append(cand.name)
            continue
        reference_code, ref_error = read_program(ref)
        candidate_code, cand_error = read_program(cand)
        if ref_error or cand_error:
            # a row with its reason, as the harness writes a failure of that phase
            row = empty_row(cand.stem, backend)
            row.update(error=ref_error or cand_error,
                       error_phase="reference" if ref_error else "load")
            found.unreadable.append(row)
            log.warning("%s", row["error"])
            continue
        found.jobs.append(Job(job_id=cand.stem, reference_code=reference_code,
                              candidate_code=candidate_code, backend=backend))
    if found.no_reference:
        log.warning("%d candidates have no reference of the same name in %s (skipped): %s",
                    len(found.no_reference), references, names_text(found.no_reference))
    if found.no_candidate:
        log.warning("%d references have no candidate of the same name in %s (skipped): %s",
                    len(found.no_candidate), candidates, names_text(found.no_candidate))
    if not found.jobs and not found.unreadable:
        raise HarnessError(f"no candidate in {candidates} has a reference of the same file "
                           f"name in {references}.")
    return found


def names_text(files: list[str], shown: int = 10) -> str:
    more = f" and {len(files) - shown} more" if len(files) > shown else ""
    return ", ".join(files[:shown]) + more


def _pick(columns: list[str], wanted: tuple[str, ...], path: Path, what: str) -> str | None:
    for name in wanted:
        if name in columns:
            return name
    if what:
        raise HarnessError(f"{path}: no {what} column. Expected one of {list(wanted)}; "
                           f"found {columns}.")
    return None


def load_pairs_jobs(path: Path, backend: str) -> list:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not path.is_file():
        raise HarnessError(f"--pairs {path}: no such file.")
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise HarnessError(f"{path}: not a readable Parquet file ({reason}).") from exc
    ref_col = _pick(table.column_names, REFERENCE_COLUMNS, path, "reference code")
    cand_col = _pick(table.column_names, CANDIDATE_COLUMNS, path, "candidate code")
    id_col = _pick(table.column_names, ID_COLUMNS, path, "")
    rows = table.to_pylist()
    ids = [str(row[id_col]) for row in rows] if id_col else [f"{i:06d}" for i in range(len(rows))]
    if len(set(ids)) != len(ids):
        raise HarnessError(f"{path}: column {id_col!r} has repeated values; ids must be unique.")
    return [Job(job_id=i, reference_code=row[ref_col], candidate_code=row[cand_col],
                backend=backend) for i, row in zip(ids, rows)]


def unpaired_lines(found: FolderJobs) -> list[str]:
    """The summary's account of what was not scored, by file name."""
    lines = []
    if found.unreadable:
        lines.append(f"{len(found.unreadable)} files could not be read (rows with their "
                     f"reason): {names_text([row['job_id'] + '.py' for row in found.unreadable])}")
    if found.no_reference:
        lines.append(f"{len(found.no_reference)} candidates have no reference (not scored): "
                     f"{names_text(found.no_reference)}")
    if found.no_candidate:
        lines.append(f"{len(found.no_candidate)} references have no candidate (not scored): "
                     f"{names_text(found.no_candidate)}")
    return lines
