"""`dicepipe rl-e2e`: BiC-RL stage 2, end-to-end kernel generation, from the rl_infill checkpoint.

    dicepipe rl-e2e --scale tiny --model models/rl_infill/tiny \\
        --data data/cuke/seed/rl_e2e.parquet --val data/cuke/seed/val.parquet \\
        --out models/rl_e2e/tiny --metrics metrics/rl_e2e/tiny

The stage itself (settings, several GPUs, resuming) is stages/rl.py; params.yaml `rl.stages.rl_e2e`.
"""

from __future__ import annotations

from .rl import add_arguments, run_stage  # noqa: F401  (the CLI reads add_arguments here)


def run(args, params) -> int:
    return run_stage(args, params, stage="rl_e2e")
