"""The harness's settings schema (schema.yaml beside this file) and its defaults."""

from __future__ import annotations

import copy
import functools
from pathlib import Path

import yaml

SCHEMA_PATH = Path(__file__).resolve().parent / "schema.yaml"


@functools.lru_cache(maxsize=1)
def _schema() -> dict:
    with open(SCHEMA_PATH) as fh:
        return yaml.safe_load(fh)


def settings_schema() -> dict:
    """The JSON schema of a `harness:` params section, as a dict of the caller's own."""
    return copy.deepcopy(_schema())


def settings_defaults() -> dict:
    """{"measure": {...}, "run": {...}}: every key's default, from the schema."""
    props = _schema()["properties"]
    return {part: {name: copy.deepcopy(sub["default"])
                   for name, sub in props[part]["properties"].items()}
            for part in ("measure", "run")}
