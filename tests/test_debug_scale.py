"""The debug scale on one GPU: the real path (SDAR-shaped model loaded as SDAR, CUDA corpus,
torchrun and FSDP at one rank, bf16 with compiled layers and FlexAttention, fp16 evaluation)
from ingest to results/kernelbench_debug.csv under Snakemake, and what its run shows.

The GPU test runs `snakemake --cores <cpus> results/kernelbench_debug.csv` in the workspace
(the repository, or DICEPIPE_DEBUG_WORKSPACE), which does nothing when that run is already
there, then asks of its outputs what the tiny scale's run must show (tests/test_pipeline.py
learning_failures, on all 8 held-out chains), plus: SFT's first steps follow the golden
per-step losses (tests/golden/debug.json, recorded from a cold run on the GPU machine), no
loss is NaN or infinite, SFT leaves the base's C++ for CUDA (its greedy `val` samples are
CUDA kernel files that compile), and the reference copies are judged correct on every
benchmark task (the harness on this GPU). Record the golden losses from a run's metrics:

    python tests/test_debug_scale.py record metrics/sft/debug/steps.tsv "<card>"
"""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden" / "debug.json"
GOLDEN_STEPS = 20
# bf16 with compiled layers: FlexAttention's backward sums with atomics, so two runs on the
# same card part by a few per cent within 20 steps (the tiny scale's torchrun test: 2% in 6).
GOLDEN_RTOL = 0.05
TARGET = "results/kernelbench_debug.csv"


def _workspace() -> Path:
    return Path(os.environ.get("DICEPIPE_DEBUG_WORKSPACE", REPO_ROOT))


def _rows(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f, delimiter="\t"))


def sft_losses(steps_tsv: Path) -> list[float]:
    return [float(row["loss"]) for row in _rows(steps_tsv)]


def debug_failures(ws: Path) -> list[str]:
    """What the debug run failed to show (empty: it showed everything listed above)."""
    from test_pipeline import learning_failures

    failures = learning_failures(ws, scale="debug", min_val_tasks=8)
    losses = sft_losses(ws / "metrics/sft/debug/steps.tsv")
    rl_losses = [float(row["loss"]) for stage in ("rl_infill", "rl_e2e")
                 for row in _rows(ws / f"metrics/{stage}/debug/steps.tsv")]
    bad = [x for x in losses + rl_losses if not math.isfinite(x)]
    if bad:
        failures.append(f"losses that are not finite: {bad[:3]}")
    golden = json.loads(GOLDEN.read_text())["sft_losses"] if GOLDEN.is_file() else None
    if golden is None:
        failures.append(f"no golden losses at {GOLDEN} (record them: this file's docstring)")
    elif losses[:len(golden)] != pytest.approx(golden, rel=GOLDEN_RTOL):
        failures.append(f"SFT's first losses {losses[:len(golden)]} are not the golden {golden}")
    if not losses[-1] < losses[0] / 10:
        failures.append(f"SFT's loss {losses[0]} -> {losses[-1]}")
    before = json.loads((ws / "metrics/rl_infill/debug/val_samples.json").read_text())["before"]["samples"]
    cuda = [s for s in before if s["compiled"] and "__global__" in s["text"]]
    if not cuda:
        failures.append("no greedy val sample of the SFT model is a CUDA kernel that compiled")
    with open(ws / "results/kernelbench_debug/baselines/reference_copies/tasks.csv") as f:
        copies = list(csv.DictReader(f))
    right = [row for row in copies if row["strict.plain.correct"] == "true"]
    if not copies or len(right) < len(copies):
        failures.append(f"reference copies: {len(right)} of {len(copies)} tasks correct (strict)")
    return failures


@pytest.mark.gpu
@pytest.mark.slow
def test_the_debug_run_learns_on_the_gpu():
    ws = _workspace()
    cores = str(os.cpu_count() or 1)
    subprocess.run([sys.executable, "-m", "snakemake", "--cores", cores, TARGET], cwd=ws, check=True)
    assert not debug_failures(ws)


def record(steps_tsv: str, card: str) -> None:
    GOLDEN.write_text(json.dumps({
        "sft_losses": sft_losses(Path(steps_tsv))[:GOLDEN_STEPS],
        "recorded_on": card,
        "command": "snakemake --cores 16 results/kernelbench_debug.csv (cold), metrics/sft/debug/steps.tsv",
    }, indent=1) + "\n")


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] != "record":
        sys.exit(__doc__)
    record(sys.argv[2], sys.argv[3])
