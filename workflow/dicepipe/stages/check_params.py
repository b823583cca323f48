"""`dicepipe check-params`: validate params.yaml (the CLI does so before every stage)."""

from __future__ import annotations

from ..config import resolve_scale


def add_arguments(parser) -> None:
    del parser


def run(args, params: dict) -> int:
    for name in params["scales"]:
        scale = resolve_scale(params, name)
        print(f"{name}: corpus={scale.corpus} model={scale.model} backend={scale.backend} "
              f"benchmark={scale.benchmark}")
    print(f"{args.params}: valid")
    return 0
