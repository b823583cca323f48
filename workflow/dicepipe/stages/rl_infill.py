"""`dicepipe rl-infill`: BiC-RL stage 1, kernel infilling, from the SFT checkpoint.

    dicepipe rl-infill --scale tiny --model models/sft/tiny \\
        --data data/cuke/seed/rl_infill.parquet --val data/cuke/seed/val.parquet \\
        --out models/rl_infill/tiny --metrics metrics/rl_infill/tiny

Settings: params.yaml `rl` (defaults, stages.rl_infill, overrides.<scale>). Several GPUs:
`torchrun --nproc_per_node 8 -m dicepipe.cli rl-infill ...` (FSDP). A killed run resumes
from its last step under --work-dir. The output is the step with the best validation reward
(metrics/rl_infill/<scale>/summary.json names it).
"""

from __future__ import annotations

STAGE = "rl_infill"


def add_arguments(parser) -> None:
    from ..train.rl_stage import add_arguments as shared

    shared(parser)


def run(args, params) -> int:
    from ..train.rl_stage import run_stage

    return run_stage(args, params, STAGE)
