"""`dicepipe rl-e2e`: BiC-RL stage 2, end-to-end kernel generation, from the rl_infill checkpoint.

    dicepipe rl-e2e --scale tiny --model models/rl_infill/tiny \\
        --data data/cuke/seed/rl_e2e.parquet --val data/cuke/seed/val.parquet \\
        --out models/rl_e2e/tiny --metrics metrics/rl_e2e/tiny

Settings: params.yaml `rl` (defaults, stages.rl_e2e, overrides.<scale>). Several GPUs:
`torchrun --nproc_per_node 8 -m dicepipe.cli rl-e2e ...` (FSDP). A killed run resumes
from its last step under --work-dir. The output is the step with the best validation reward
(metrics/rl_e2e/<scale>/summary.json names it).
"""

from __future__ import annotations

STAGE = "rl_e2e"


def add_arguments(parser) -> None:
    from ..train.rl_stage import add_arguments as shared

    shared(parser)


def run(args, params) -> int:
    from ..train.rl_stage import run_stage

    return run_stage(args, params, STAGE)
