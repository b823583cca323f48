"""Loading and validating params.yaml, and resolving a scale to its parts.

Values stay plain dicts (as in nanoGPT): stages read their own section. Validation is
the JSON schema under workflow/schemas/ (the same file the Snakefile validates with)
plus cross-references the schema cannot express (a scale's corpus must exist, ...).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError

SCHEMA_PATH = Path(__file__).resolve().parent.parent / "schemas" / "params.schema.yaml"
DEFAULT_PARAMS = Path("params.yaml")


def load_schema() -> dict:
    with open(SCHEMA_PATH) as fh:
        return yaml.safe_load(fh)


def _key_path(error) -> str:
    parts = [str(p) for p in error.absolute_path]
    return ".".join(parts) if parts else "<top level>"


def _fill_defaults(instance: Any, schema: dict, root: dict) -> None:
    """Fill `default:` values of object properties, recursively (like snakemake's validate)."""
    if "$ref" in schema:
        ref = schema["$ref"].split("/")[1:]
        target = root
        for part in ref:
            target = target[part]
        _fill_defaults(instance, target, root)
    if not isinstance(instance, dict):
        return
    for name, sub in schema.get("properties", {}).items():
        if name not in instance and "default" in sub:
            instance[name] = copy.deepcopy(sub["default"])
        if name in instance:
            _fill_defaults(instance[name], sub, root)
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        for name, value in instance.items():
            if name not in schema.get("properties", {}):
                _fill_defaults(value, extra, root)


def validate_params(params: dict, source: str = "params.yaml") -> dict:
    """Validate against the schema and cross-check references; return a copy with defaults."""
    import jsonschema

    schema = load_schema()
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(params), key=lambda e: list(e.absolute_path))
    if errors:
        err = errors[0]
        more = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
        raise ConfigError(
            f"{source}: key '{_key_path(err)}' has value {err.instance!r}: {err.message}. "
            f"Expected: {_expected(err)}.{more}"
        )
    params = copy.deepcopy(params)
    _fill_defaults(params, schema, schema)
    _cross_check(params, source)
    return params


def _expected(err) -> str:
    schema = err.schema if isinstance(err.schema, dict) else {}
    for key in ("enum", "type", "pattern", "minimum", "maximum", "exclusiveMinimum"):
        if key in schema:
            return f"{key} {schema[key]!r}"
    if err.validator == "required":
        return f"the keys {err.validator_value!r}"
    if err.validator in ("additionalProperties", "unevaluatedProperties"):
        allowed = sorted(schema.get("properties", {}))
        return f"only the keys {allowed}" if allowed else "no extra keys"
    return f"{err.validator} {err.validator_value!r}"


def _cross_check(params: dict, source: str) -> None:
    for scale, spec in params["scales"].items():
        for kind, table in (("corpus", "corpora"), ("model", "models"), ("benchmark", "benchmarks")):
            if spec[kind] not in params[table]:
                raise ConfigError(
                    f"{source}: key 'scales.{scale}.{kind}' has value {spec[kind]!r}, which is "
                    f"not defined under '{table}'. Expected one of {sorted(params[table])}."
                )
        corpus_backend = params["corpora"][spec["corpus"]]["backend"]
        if corpus_backend != spec["backend"]:
            raise ConfigError(
                f"{source}: key 'scales.{scale}.backend' is {spec['backend']!r} but its corpus "
                f"{spec['corpus']!r} is for backend {corpus_backend!r}. Expected them to agree."
            )
    for scale in params.get("default_scales", []):
        if scale not in params["scales"]:
            raise ConfigError(
                f"{source}: key 'default_scales' names {scale!r}, which is not under 'scales'. "
                f"Expected one of {sorted(params['scales'])}."
            )
    overrides = params["sft"]["overrides"]
    for scale in overrides:
        if scale not in params["scales"]:
            raise ConfigError(
                f"{source}: key 'sft.overrides.{scale}' names no scale. "
                f"Expected one of {sorted(params['scales'])}."
            )
    for scale in params["scales"]:
        if scale not in overrides:
            raise ConfigError(
                f"{source}: key 'sft.overrides.{scale}' is missing. Expected an entry for every "
                "scale ({} for no overrides), so each runner tracks exactly its own settings."
            )
    _check_tolerances(params, source)
    shards = params["verify"]["shards"]
    expected = [f"{i}-of-{len(shards)}" for i in range(1, len(shards) + 1)]
    if shards != expected:
        raise ConfigError(
            f"{source}: key 'verify.shards' has value {shards!r}. Expected the list {expected!r} "
            "(shard ids I-of-N for I = 1..N; DVC needs them spelled out)."
        )
    for name, model in params["models"].items():
        if model["kind"] in ("sdar", "qwen3") and "path" not in model:
            raise ConfigError(
                f"{source}: key 'models.{name}.path' is missing. Expected a hub id or a local "
                "checkpoint folder for a model of kind " + repr(model["kind"]) + "."
            )


def _tolerance_keys(node, path: str = ""):
    """Every `tolerance: <profile name>` a stage section sets (any depth)."""
    if isinstance(node, dict):
        for key, value in node.items():
            where = f"{path}.{key}" if path else str(key)
            if key == "tolerance" and isinstance(value, str):
                yield where, value
            else:
                yield from _tolerance_keys(value, where)


def _check_tolerances(params: dict, source: str) -> None:
    profiles = params["tolerance_profiles"]
    for where, name in _tolerance_keys(params):
        if name not in profiles:
            raise ConfigError(
                f"{source}: key '{where}' has value {name!r}, which is not a profile under "
                f"'tolerance_profiles'. Expected one of {sorted(profiles)}."
            )
    loosest = params["harness"].get("max_tolerance")
    if loosest is None:
        return
    for name, values in profiles.items():
        for precision, tol in values.items():
            if tol > loosest:
                raise ConfigError(
                    f"{source}: key 'tolerance_profiles.{name}.{precision}' has value {tol!r}, "
                    f"looser than harness.max_tolerance={loosest!r}: kernels between the two "
                    "would never be timed. Expected at most harness.max_tolerance (or raise it)."
                )


def load_params(path: str | Path = DEFAULT_PARAMS) -> dict:
    """Read and validate params.yaml. Raises ConfigError with file, key, value and expectation."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such file. Run from the repository root or pass --params.")
    try:
        with open(path) as fh:
            params = yaml.safe_load(fh)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(params, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(params).__name__}.")
    return validate_params(params, str(path))


@dataclass(frozen=True)
class Scale:
    """A scale resolved to its parts (names and their param sections)."""

    name: str
    corpus: str
    model: str
    backend: str
    benchmark: str
    model_spec: dict
    benchmark_spec: dict


def resolve_scale(params: dict, scale: str) -> Scale:
    if scale not in params["scales"]:
        raise ConfigError(f"unknown scale {scale!r}. Expected one of {sorted(params['scales'])}.")
    spec = params["scales"][scale]
    return Scale(
        name=scale,
        corpus=spec["corpus"],
        model=spec["model"],
        backend=spec["backend"],
        benchmark=spec["benchmark"],
        model_spec=params["models"][spec["model"]],
        benchmark_spec=params["benchmarks"][spec["benchmark"]],
    )


def corpus_spec(params: dict, corpus: str) -> dict:
    if corpus not in params["corpora"]:
        raise ConfigError(f"unknown corpus {corpus!r}. Expected one of {sorted(params['corpora'])}.")
    return params["corpora"][corpus]


def sft_settings(params: dict, scale: str) -> dict:
    """The sft section with the scale's overrides applied."""
    settings = dict(params["sft"]["defaults"])
    settings.update(params["sft"]["overrides"].get(scale) or {})
    return settings


def split_key(params: dict, dotted: str) -> list[str]:
    """Split a dotted params key into its path, allowing names that contain dots
    (the scale `1.7b`): at each level the longest matching name wins."""
    parts, node, rest = [], params, dotted.split(".")
    while rest:
        for n in range(len(rest), 0, -1):
            name = ".".join(rest[:n])
            if isinstance(node, dict) and name in node:
                parts.append(name)
                node, rest = node[name], rest[n:]
                break
        else:
            raise ConfigError(f"params key {dotted!r} does not exist (stopped at {'.'.join(parts) or '<top>'}).")
    return parts


def lookup(params: dict, dotted: str):
    value = params
    for part in split_key(params, dotted):
        value = value[part]
    return value


# Sections whose entries are named by scale.
SCALE_KEYED_SECTIONS = {("scales",), ("sft", "overrides")}


def dvc_trackable_key(params: dict, dotted: str) -> str:
    """The key dvc.yaml lists for a key Snakemake tracks. DVC addresses params by dotted path
    and cannot address a name containing a dot (the scale `1.7b`); since one foreach template
    serves every scale, per-scale entries are tracked through their parent (`scales`,
    `sft.overrides`) whenever any scale name has a dot. A superset: DVC may re-run a little more."""
    parts = split_key(params, dotted)
    dotted_scales = any("." in name for name in params["scales"])
    for i, part in enumerate(parts):
        scale_keyed = tuple(parts[:i]) in SCALE_KEYED_SECTIONS
        if "." in part or (dotted_scales and scale_keyed):
            return ".".join(parts[:i])
    return dotted
