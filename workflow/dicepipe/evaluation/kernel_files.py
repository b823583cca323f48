"""Kernel files on disk: the ones evaluation writes for a model's generations, and folders
of already generated kernels (another system's released outputs) read as a baseline.

Two folder layouts are read: KernelBench's run folders,
`level_{L}_problem_{P}_sample_{S}_kernel.py` (anywhere below the folder), and a simpler
`level{L}/{name}.py` (one sample, the benchmark's own file names). Evaluation writes the
first, so a model's outputs folder is itself a folder baseline.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from kernelharness.programs import read_program

from ..data import extract
from ..errors import SourceError
from .scoring import Candidate

log = logging.getLogger(__name__)
_KB_FILE = re.compile(r"^level_(\d+)_problem_(\d+)_sample_(\d+)_kernel\.py$")


def kernel_file_name(level: int, problem_id: int, sample: int) -> str:
    return f"level_{level}_problem_{problem_id}_sample_{sample}_kernel.py"


def candidates_from_texts(tasks: Sequence[Mapping], texts: Sequence[Sequence[str]],
                          kernels_dir: Path, relative_to: Path, code_block: str = "first"
                          ) -> list[Candidate]:
    """Extract each generation's code block and write it as a kernel file (KernelBench
    naming); a generation without a code block gets no file and the note `no_code_block`."""
    kernels_dir.mkdir(parents=True, exist_ok=True)
    out = []
    for task, samples in zip(tasks, texts):
        for sample, text in enumerate(samples):
            path = kernels_dir / kernel_file_name(task["level"], task["problem_id"], sample)
            code = extract.code_from_text(text, code_block)
            if code is not None:
                path.write_text(code)
            out.append(Candidate(task["task_id"], sample, code,
                                 _relative(path, relative_to, kernels_dir) if code is not None else "",
                                 "" if code is not None else "no_code_block"))
    return out


def _relative(path: Path, base: Path, folder: Path) -> str:
    """The path as artifacts record it: relative to the working directory, or, for a folder
    elsewhere, `<folder name>/<path inside it>` (never an absolute path)."""
    try:
        return str(path.resolve().relative_to(base.resolve()))
    except ValueError:
        return str(Path(folder.resolve().name) / path.resolve().relative_to(folder.resolve()))


def read_folder(folder: Path, tasks: Sequence[Mapping], relative_to: Path) -> list[Candidate]:
    """Candidates for every task from a folder of kernel files; a task (or sample) with no
    file is a candidate without code (`missing_file`), as KernelBench's analysis counts it,
    and a file that cannot be read one without code whose note says why (`unreadable_file`)."""
    if not folder.is_dir():
        raise SourceError(f"{folder}: no such folder of kernel files. Expected "
                          "level_<L>_problem_<P>_sample_<S>_kernel.py files or level<L>/<name>.py.")
    found: dict[tuple[str, int], Path] = {}
    by_problem = {(int(t["level"]), int(t["problem_id"])): t["task_id"] for t in tasks}
    by_name = {(int(t["level"]), t["name"]): t["task_id"] for t in tasks}
    for path in sorted(folder.rglob("*.py")):
        match = _KB_FILE.match(path.name)
        if match:
            level, problem, sample = map(int, match.groups())
            task_id = by_problem.get((level, problem))
        else:
            level_dir = re.fullmatch(r"level(\d+)", path.parent.name)
            if not level_dir:
                continue
            task_id, sample = by_name.get((int(level_dir.group(1)), path.stem)), 0
        if task_id is not None:
            found[(task_id, sample)] = path
    if not found:
        raise SourceError(f"{folder}: no kernel file matches a benchmark task (by "
                          "level_<L>_problem_<P>_sample_<S>_kernel.py or level<L>/<name>.py).")
    samples = 1 + max(sample for _, sample in found)
    out = []
    for task in tasks:
        for sample in range(samples):
            path = found.get((task["task_id"], sample))
            if path is None:
                out.append(Candidate(task["task_id"], sample, None, "", "missing_file"))
                continue
            kernel_path = _relative(path, relative_to, folder)
            code, why = read_program(path)
            if code is None:
                log.warning("%s", why)
            out.append(Candidate(task["task_id"], sample, code, kernel_path,
                                 "" if code is not None else
                                 f"unreadable_file: {why.replace(str(path), kernel_path)}"))
    return out


def write_reference_copies(tasks: Sequence[Mapping], folder: Path) -> int:
    """A folder baseline with a known answer: each task's ModelNew is a copy of its Model
    (correct, speedup ~1, no kernel of its own so never robust). Returns files written."""
    from ..data.benchmark import reference_copy

    for task in tasks:
        path = folder / kernel_file_name(task["level"], task["problem_id"], 0)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(reference_copy(task["reference_code"]))
    return len(tasks)
