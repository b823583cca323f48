"""Generations of stage outputs: how Snakemake's plan notices an output that went missing.

Snakemake re-plans a job whose output is missing only when that job is a target; an
intermediate output (models/sft/<scale>) that is gone while the outputs made from it are
still there is taken as fine ("Nothing to be done"). And when a job fails or is killed,
Snakemake removes its outputs but records them as made under the new params (9.x writes the
failed job's metadata), so even a params change no longer shows. Every rule therefore
tracks one more param, the generation of its outputs: a planning run that finds any output
of a job missing gives that job a new generation, so the job's params differ from what
Snakemake recorded for it, it is planned again and everything made from it after it.

The state lives beside Snakemake's own records (.snakemake/dicepipe/generations.json): per
job (named by its first output) the generation and whether a planning run has seen its
outputs there since. One value per job and process, so a plan and the run after it agree;
only the top-level Snakemake process writes (cluster jobs read the Snakefile again and find
their own outputs missing, as they are about to make them).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

STATE_FILE = Path(".snakemake/dicepipe/generations.json")


class Generations:
    def __init__(self, path: Path | str = STATE_FILE, writable: bool = True, stream=None):
        self.path = Path(path)
        self.writable = writable
        self.stream = stream if stream is not None else sys.stderr
        self._decided: dict[str, int] = {}

    def _read(self) -> dict:
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}

    def _write(self, state: dict) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(state, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, self.path)

    def of(self, outputs: list[str], job: str = "") -> int:
        """The generation of a job's outputs (paths relative to the working folder)."""
        key = outputs[0]
        if key in self._decided:
            return self._decided[key]
        state = self._read()
        entry = state.get(key, {})
        generation, made = int(entry.get("generation", 0)), bool(entry.get("made", False))
        missing = [o for o in outputs if not os.path.exists(o)]
        if self.writable and (missing or not made):
            if missing:
                generation += 1
                if made:
                    self.note_missing(missing, job)
            state[key] = {"generation": generation, "made": not missing}
            self._write(state)
        self._decided[key] = generation
        return generation

    def note_missing(self, missing: list[str], job: str) -> None:
        more = f" (and {len(missing) - 1} more of its outputs)" if len(missing) > 1 else ""
        print(f"dicepipe: {missing[0]}{more} is missing, though an earlier run made it: a job "
              f"that was killed, failed or interrupted, or a deletion. {job or 'Its job'} is "
              "planned again, and every stage made from it after it.", file=self.stream)
