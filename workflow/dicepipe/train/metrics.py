"""Per-step metrics as a TSV that DVC plots directly (x: step), and a summary JSON for
`dvc metrics`. On resume the TSV is cut back to the checkpoint's step, so a resumed run's
file reads as one run."""

from __future__ import annotations

import json
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
