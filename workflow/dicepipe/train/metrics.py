"""Per-step metrics as a TSV that DVC plots directly (x: step), and a summary JSON for
`dvc metrics`.

The TSVs are written in the run's work folder, next to the checkpoints, and copied into the
metrics folder when the run ends (`publish_logs`): both runners delete a failed job's
declared outputs before re-running it, so rows kept there would be lost on a resume. On
resume a TSV is cut back to the checkpoint's step and the rows before it are kept as they
were written (measurements included, never recomputed), so a resumed run's file reads as
one run. `RunProgress` carries the whole run's totals (wall time, tokens, the steps it
resumed at) through the checkpoints, so the summary counts every part of the run."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

STEP_COLUMNS = ("step", "epoch", "loss", "learning_rate", "grad_norm", "tokens", "masked_tokens",
                "tokens_per_s")


class StepLog:
    def __init__(self, path: Path, resume_step: int, enabled: bool = True,
                 columns: tuple[str, ...] = STEP_COLUMNS):
        self.path = Path(path)
        self.enabled = enabled
        self.columns = tuple(columns)
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept = self._rows_up_to(resume_step) if resume_step else []
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text("\t".join(self.columns) + "\n" + "".join(kept))
        tmp.replace(self.path)

    def _rows_up_to(self, step: int) -> list[str]:
        if not self.path.is_file():
            return []
        lines = self.path.read_text().splitlines(keepends=True)[1:]
        return [line for line in lines if line.strip() and int(line.split("\t")[0]) <= step]

    def write(self, row: dict) -> None:
        if not self.enabled:
            return
        values = [_format(row[c]) for c in self.columns]
        with open(self.path, "a") as fh:
            fh.write("\t".join(values) + "\n")

    def losses(self, column: str = "loss") -> list[float]:
        if not self.enabled or not self.path.is_file():
            return []
        lines = self.path.read_text().splitlines()[1:]
        col = self.columns.index(column)
        return [float(line.split("\t")[col]) for line in lines if line.strip()]


def _format(value) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def write_summary(path: Path, summary: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)


def publish_logs(work_dir: Path, metrics_dir: Path, names: tuple[str, ...]) -> None:
    """Copy the step logs from the work folder into the metrics folder (the declared outputs);
    each lands whole under its name, so a kill mid-copy leaves no half file there."""
    Path(metrics_dir).mkdir(parents=True, exist_ok=True)
    for name in names:
        tmp = Path(metrics_dir) / (name + ".tmp")
        shutil.copyfile(Path(work_dir) / name, tmp)
        tmp.replace(Path(metrics_dir) / name)


class RunProgress:
    """The whole run's totals across resumes. `saved` is what the checkpoint the run starts
    from carried (`state()` of the run that saved it; {} for a fresh run), `start` its step.
    Used as a context manager it times one step."""

    def __init__(self, saved: dict, start: int):
        self.train_time_s = float(saved.get("train_time_s", 0.0))
        self.tokens = int(saved.get("tokens", 0))
        self.resumed_at_steps = [int(s) for s in saved.get("resumed_at_steps", [])]
        if start:
            self.resumed_at_steps.append(int(start))
        self.last_s = 0.0

    def __enter__(self):
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.last_s = time.perf_counter() - self._t0
        self.train_time_s += self.last_s

    def state(self, **extra) -> dict:
        """What to save with a checkpoint (`extra`: the loop's own state, JSON)."""
        return {"train_time_s": self.train_time_s, "tokens": self.tokens,
                "resumed_at_steps": list(self.resumed_at_steps), **extra}

    def resume_note(self) -> dict:
        """The summary's record of resumes: how many, at which steps (0 and [] when none)."""
        return {"resumes": len(self.resumed_at_steps), "resumed_at_steps": list(self.resumed_at_steps)}
