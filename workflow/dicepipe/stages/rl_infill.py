"""`dicepipe rl-infill`: BiC-RL stage 1, kernel infilling, from the SFT checkpoint.

    dicepipe rl-infill --scale tiny --model models/sft/tiny \\
        --data data/cuke/seed/rl_infill.parquet --val data/cuke/seed/val.parquet \\
        --out models/rl_infill/tiny --metrics metrics/rl_infill/tiny

The stage itself (settings, several GPUs, resuming) is stages/rl.py; params.yaml `rl.stages.rl_infill`.
"""

from __future__ import annotations

from .rl import add_arguments, run_stage  # noqa: F401  (the CLI reads add_arguments here)


def run(args, params) -> int:
    return run_stage(args, params, stage="rl_infill")
