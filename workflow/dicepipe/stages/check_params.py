"""`dicepipe check-params`: validate params.yaml (the CLI does so before every stage).

With `--out`, it is DVC's first stage: every other stage descends from it, so `dvc repro`
stops on a bad value before any stage deletes its outputs (DVC removes a stage's outputs
right before running it). The file it writes is the same for every valid params.yaml, so a
valid edit re-runs only the stages that track the edited keys."""

from __future__ import annotations

import json
from pathlib import Path

from ..config import resolve_scale


def add_arguments(parser) -> None:
    parser.add_argument("--out", default=None,
                        help="write a marker file once params are valid (DVC's check_params stage)")


def run(args, params: dict) -> int:
    for name in params["scales"]:
        scale = resolve_scale(params, name)
        print(f"{name}: corpus={scale.corpus} model={scale.model} backend={scale.backend} "
              f"benchmark={scale.benchmark}")
    print(f"{args.params}: valid")
    if getattr(args, "out", None):
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"params": "valid"}, sort_keys=True) + "\n")
    return 0
