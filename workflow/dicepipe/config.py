"""Loading and validating params.yaml, and resolving a scale to its parts.

Values stay plain dicts (as in nanoGPT): stages read their own section. Validation is
the JSON schema shipped inside the package (dicepipe/schemas/params.schema.yaml, the same
file the Snakefile validates with, and the one home of every default) plus cross-references
the schema cannot express (a scale's corpus must exist, ...).
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError

SCHEMA_PATH = Path(__file__).resolve().parent / "schemas" / "params.schema.yaml"
DEFAULT_PARAMS = Path("params.yaml")


def load_schema() -> dict:
    """The schema, as a dict of the caller's own."""
    return copy.deepcopy(_schema())


def _schema() -> dict:
    """The schema, read once per version of the file (validation, the resolver and
    schema_defaults ask for it many times per command); never modified by its readers."""
    stat = SCHEMA_PATH.stat()
    return _read_schema(str(SCHEMA_PATH), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=4)
def _read_schema(path: str, mtime_ns: int, size: int) -> dict:
    from kernelharness.schema import settings_schema

    with open(path) as fh:
        schema = yaml.safe_load(fh)
    # the `harness` section is the harness package's own schema (its defaults live there)
    schema["$defs"]["harness"] = settings_schema()
    return schema


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

    schema = _schema()
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(params), key=lambda e: list(e.absolute_path))
    if errors:
        raise ConfigError(schema_error_message(errors[0], source, len(errors) - 1, schema))
    params = copy.deepcopy(params)
    _fill_defaults(params, schema, schema)
    _cross_check(params, source)
    return params


_TYPE_WORDS = {"integer": "a whole number", "number": "a number", "string": "a string",
               "boolean": "true or false", "array": "a list", "object": "a mapping", "null": "null"}


def schema_error_message(err, source: str, others: int = 0, root: dict | None = None) -> str:
    """One line naming the file, the key, the value, the rule it breaks and what would pass
    ("must be greater than 0", not the first keyword of the property's schema)."""
    key = _key_path(err)
    more = f" (and {others} more problems)" if others else ""
    if err.validator in ("additionalProperties", "unevaluatedProperties"):
        root = root or _schema()
        allowed = sorted(_property_names(err.schema, root))
        unknown = sorted(set(err.instance) - set(allowed))
        moved = _moved(key, unknown, err.schema, root)
        return (f"{source}: key '{key}' has unknown keys {unknown}: they are not settings of the "
                f"pipeline (a typo?). Expected only the keys {allowed}."
                + (f" Moved: {'; '.join(moved)}." if moved else "") + more)
    if err.validator == "required":
        missing = [k for k in err.validator_value if k not in err.instance]
        return (f"{source}: key '{key}' is missing the required keys {missing}. "
                f"Expected: add them (see the schema, {SCHEMA_PATH.name}).{more}")
    shown = repr(err.instance)
    shown = shown if len(shown) <= 200 else shown[:200] + "..."
    return (f"{source}: key '{key}' has value {shown}, which breaks the rule: "
            f"{_rule(err.validator, err.validator_value)}. "
            f"Expected: {_describe(err.schema)}.{more}")


# Keys of an earlier params.yaml shape and where they live now (named in the error message).
MOVED_KEYS = {
    "harness.robust": "each judging stage's own key: augment.robust, score.robust "
                      "(assemble.robust, rl.defaults.robust as before)",
}


def _moved(key: str, unknown: list[str], schema, root: dict) -> list[str]:
    """Where unknown keys went: a known move, or a key of one of the object's sub-objects
    (harness.correct_trials is now harness.measure.correct_trials)."""
    found = []
    subs = {name: _property_names(_resolve(sub, root), root)
            for name, sub in (schema.get("properties") or {}).items() if isinstance(sub, dict)}
    for name in unknown:
        old = f"{key}.{name}"
        if old in MOVED_KEYS:
            found.append(f"'{old}' is now {MOVED_KEYS[old]}")
        found += [f"'{old}' is now '{key}.{sub}.{name}'" for sub, names in subs.items()
                  if name in names]
    return found


def _property_names(schema, root: dict) -> set[str]:
    """Keys an object schema names, through $ref chains (what unevaluatedProperties allows)."""
    if not isinstance(schema, dict):
        return set()
    names = set(schema.get("properties", {}))
    if "$ref" in schema:
        target = root
        for part in schema["$ref"].split("/")[1:]:
            target = target[part]
        names |= _property_names(target, root)
    return names


def _rule(keyword: str, value) -> str:
    rules = {
        "exclusiveMinimum": f"must be greater than {value}",
        "minimum": f"must be at least {value}",
        "exclusiveMaximum": f"must be less than {value}",
        "maximum": f"must be at most {value}",
        "enum": f"must be one of {value}",
        "pattern": f"must match the pattern {value}",
        "minItems": f"must have at least {value} items",
        "maxItems": f"must have at most {value} items",
        "minLength": f"must have at least {value} characters",
        "minProperties": f"must have at least {value} entries",
        "uniqueItems": "must not repeat an item",
    }
    if keyword == "type":
        kinds = value if isinstance(value, list) else [value]
        return "must be " + " or ".join(_TYPE_WORDS.get(k, k) for k in kinds)
    return rules.get(keyword, f"must satisfy {keyword} {value!r}")


def _describe(schema) -> str:
    """What a property's schema accepts, in words: type, bounds, choices, pattern."""
    if not isinstance(schema, dict):
        return "a valid value"
    parts = []
    if "enum" in schema:
        parts.append(f"one of {schema['enum']}")
    elif "type" in schema:
        parts.append(_rule("type", schema["type"])[len("must be "):])
    bounds = [("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="),
              ("exclusiveMaximum", "<")]
    parts += [f"{sign} {schema[k]}" for k, sign in bounds if k in schema]
    if "pattern" in schema:
        parts.append(f"matching {schema['pattern']}")
    if "description" in schema:
        parts.append(f"({schema['description']})")
    return " ".join(parts) if parts else "a valid value (see the schema)"


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
    _check_scale_bases(params, source)
    _check_scale_baselines(params, source)
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
    _check_evaluate(params, source)
    _check_rl(params, source)
    _check_tolerances(params, source)
    shards = params["verify"]["shards"]
    expected = [f"{i}-of-{len(shards)}" for i in range(1, len(shards) + 1)]
    if shards != expected:
        raise ConfigError(
            f"{source}: key 'verify.shards' has value {shards!r}. Expected the list {expected!r} "
            "(shard ids I-of-N for I = 1..N; DVC needs them spelled out)."
        )
    for name, model in params["models"].items():
        if model["kind"] != "tiny" and "path" not in model:
            raise ConfigError(
                f"{source}: key 'models.{name}.path' is missing. Expected a hub id or a local "
                "checkpoint folder for a model of kind " + repr(model["kind"]) + "."
            )


def _tolerance_keys(node, path: str = ""):
    """Every `protocol: <protocol name>` a stage section sets (any depth)."""
    if isinstance(node, dict):
        for key, value in node.items():
            where = f"{path}.{key}" if path else str(key)
            if key == "protocol" and isinstance(value, str):
                yield where, value
            else:
                yield from _tolerance_keys(value, where)


def _check_evaluate(params: dict, source: str) -> None:
    """evaluate.overrides and baselines are keyed by scale, an entry for every scale; the
    protocols evaluation reports exist; baseline names are unique per scale."""
    if "evaluate" not in params:
        return
    scales = sorted(params["scales"])
    for key, table in (("evaluate.overrides", params["evaluate"]["overrides"]),
                       ("baselines", params.get("baselines", {}))):
        if sorted(table) != scales:
            raise ConfigError(
                f"{source}: key '{key}' has entries for {sorted(table)}. Expected exactly one per "
                f"scale {scales} ({{}} or [] for none), so each scale tracks only its own.")
    for scale, entries in params.get("baselines", {}).items():
        names = [e["name"] for e in entries]
        if "model" in names or len(set(names)) != len(names):
            raise ConfigError(f"{source}: key 'baselines.{scale}' has names {names}. Expected "
                              "unique names other than 'model' (the scale's own model).")
    _check_scale_prompts(params, source)
    for name in params["evaluate"]["protocols"]:
        if name not in params["protocols"]:
            raise ConfigError(f"{source}: key 'evaluate.protocols' names {name!r}, which is not "
                              f"under 'protocols'. Expected one of "
                              f"{sorted(params['protocols'])}.")


# Where each evaluation prompt wording is read from (the project's own is package code).
OWN_PROMPTS = "workflow/dicepipe/data/prompts.py"


def _check_scale_prompts(params: dict, source: str) -> None:
    """`scales.<s>.prompts` is what evaluate@<s> tracks for its prompt wording (DVC cannot
    pick it from the scale's evaluate `prompt`): the prompt source's folder (acquired by
    acquire@KernelBench or acquire@DICE), or the project's own prompts module."""
    for scale, spec in params["scales"].items():
        wording = stage_settings(params, "evaluate", scale=scale)["prompt"]
        expected = (OWN_PROMPTS if wording == "dicepipe"
                    else (params.get("prompt_sources") or {}).get(wording, {}).get("path"))
        if expected is not None and spec.get("prompts", "").rstrip("/") != expected.rstrip("/"):
            raise ConfigError(
                f"{source}: key 'scales.{scale}.prompts' is {spec.get('prompts')!r} but the scale's "
                f"evaluation prompt is {wording!r}, read from {expected!r}. Expected "
                f"'scales.{scale}.prompts: {expected}', so evaluate@{scale} re-runs when it changes.")


def _check_tolerances(params: dict, source: str) -> None:
    protocols = params["protocols"]
    for where, name in _tolerance_keys(params):
        if name not in protocols:
            raise ConfigError(
                f"{source}: key '{where}' has value {name!r}, which is not a protocol under "
                f"'protocols'. Expected one of {sorted(protocols)}."
            )
    verify, assemble = params.get("verify", {}), params.get("assemble", {})
    if "protocol" in verify and "protocol" in assemble:
        timed = protocols[verify["protocol"]]["check"]
        kept = protocols[assemble["protocol"]]["check"]
        if timed != kept:
            raise ConfigError(
                f"{source}: key 'assemble.protocol' is {assemble['protocol']!r} ({kept} check) "
                f"but 'verify.protocol' is {verify['protocol']!r} ({timed} check): verify times "
                f"only samples its check accepts, so assemble would find no speedup for the "
                f"others. Expected protocols with the same check.")
    measure = params["harness"]["measure"]  # schema defaults filled in
    loosest, kb_trials = measure["max_tolerance"], measure["kernelbench_trials"]
    for name, values in protocols.items():
        if values.get("check") == "kernelbench" and values.get("trials", 0) > kb_trials:
            raise ConfigError(
                f"{source}: key 'protocols.{name}.trials' has value {values['trials']!r}, more "
                f"than harness.measure.kernelbench_trials={kb_trials!r} measures. Expected at "
                "most harness.measure.kernelbench_trials (or raise it).")
        for precision in ("fp32", "low_precision"):
            tol = values[precision]
            if tol > loosest:
                raise ConfigError(
                    f"{source}: key 'protocols.{name}.{precision}' has value {tol!r}, looser "
                    f"than harness.measure.max_tolerance={loosest!r}: kernels between the two "
                    "would never be timed. Expected at most harness.measure.max_tolerance (or "
                    "raise it).")


def load_params(path: str | Path = DEFAULT_PARAMS) -> dict:
    """Read and validate params.yaml. Raises ConfigError with file, key, value and expectation."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such file. Run from the repository root or pass --params.")
    return validate_params(read_params_yaml(path), str(path))


def read_params_yaml(path: str | Path = DEFAULT_PARAMS) -> dict:
    """params.yaml as a mapping, unvalidated (the Snakefile validates it itself); a syntax
    error is a ConfigError with its line and column."""
    path = Path(path)
    try:
        with open(path, encoding="utf-8") as fh:
            params = yaml.safe_load(fh)
    except yaml.YAMLError as exc:
        raise ConfigError(yaml_error_message(path, exc)) from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte offset {exc.start}). Save it as "
                          "UTF-8.") from exc
    if not isinstance(params, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(params).__name__}.")
    return params


def yaml_error_message(path: str | Path, exc: yaml.YAMLError) -> str:
    """Where the parser stopped (1-based line and column), what it found, and the fix."""
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    context = getattr(exc, "context", None)
    context_mark = getattr(exc, "context_mark", None)
    if context and context_mark is not None and context_mark.line != getattr(mark, "line", None):
        problem += f" ({context} at line {context_mark.line + 1})"
    elif context:
        problem += f" ({context})"
    return (f"{path}: not valid YAML{where}: {problem}. Fix the syntax there (indentation by "
            f"spaces, a space after each ':', quotes closed); `git diff {path}` shows what "
            f"changed, and `dicepipe check-params --params {path}` checks it again.")


@dataclass(frozen=True)
class Scale:
    """A scale resolved to its parts (names and their param sections)."""

    name: str
    corpus: str
    model: str
    backend: str
    benchmark: str
    model_spec: dict


def scale_name(params: dict, scale: str) -> str:
    """`scale`, once params.yaml names it (a stage that needs only the name reads no more)."""
    if scale not in params["scales"]:
        raise ConfigError(f"unknown scale {scale!r}. Expected one of {sorted(params['scales'])}.")
    return scale


def resolve_scale(params: dict, scale: str) -> Scale:
    spec = params["scales"][scale_name(params, scale)]
    return Scale(
        name=scale,
        corpus=spec["corpus"],
        model=spec["model"],
        backend=spec["backend"],
        benchmark=spec["benchmark"],
        model_spec=params["models"][spec["model"]],
    )


def corpus_spec(params: dict, corpus: str) -> dict:
    if corpus not in params["corpora"]:
        raise ConfigError(f"unknown corpus {corpus!r}. Expected one of {sorted(params['corpora'])}.")
    return params["corpora"][corpus]


RL_STAGES = ("rl_infill", "rl_e2e")


def _check_rl(params: dict, source: str) -> None:
    """Every scale has an rl.overrides entry and names no unknown scale; the RL reward's
    protocol exists."""
    section = params.get("rl")
    if section is None:
        return
    overrides = section["overrides"]
    for scale in sorted(set(overrides) ^ set(params["scales"])):
        missing = scale not in overrides
        raise ConfigError(
            f"{source}: key 'rl.overrides.{scale}' "
            + ("is missing. Expected an entry for every scale ({} for no overrides)."
               if missing else f"names no scale. Expected one of {sorted(params['scales'])}.")
        )
    for where in ["defaults", *[f"stages.{s}" for s in RL_STAGES], *[f"overrides.{s}" for s in overrides]]:
        node = lookup(section, where) or {}
        name = node.get("protocol")
        if name is not None and name not in params.get("protocols", {}):
            raise ConfigError(f"{source}: key 'rl.{where}.protocol' is {name!r}, not a protocol under "
                              f"'protocols'. Expected one of {sorted(params['protocols'])}.")


def stage_settings(params: dict, section: str, *, stage: str | None = None,
                   scale: str | None = None) -> dict:
    """The one resolver of a stage's settings, for the sections with layers (`sft`, `rl`,
    `evaluate`): the schema's defaults of `<section>.defaults`, then the section's
    `defaults`, then `<section>.stages.<stage>` (rl), then `<section>.overrides.<scale>`.
    (A section without layers, such as `augment` or `harness`, is its values over the
    schema's defaults, which load_params fills in.) Returns a new dict."""
    root = _schema()
    node = _resolve(root["properties"].get(section, {}), root)
    if "defaults" not in node.get("properties", {}):
        raise ConfigError(f"params.yaml section {section!r} has no defaults/overrides layers. "
                          "Expected one of 'sft', 'rl', 'evaluate'; read other sections as "
                          "they are (load_params fills in the schema's defaults).")
    values = params[section]
    settings = copy.deepcopy(values["defaults"])
    _fill_defaults(settings, node["properties"]["defaults"], root)
    if stage is not None:
        if stage not in (values.get("stages") or {}):
            raise ConfigError(f"params.yaml: key '{section}.stages.{stage}' is missing. "
                              f"Expected one of {sorted(values.get('stages') or {})}.")
        settings.update(values["stages"][stage])
    if scale is not None:
        settings.update(values["overrides"].get(scale) or {})
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


def schema_defaults(*path: str) -> dict:
    """The defaults the schema gives the object at `path` (property names from the top), e.g.
    schema_defaults("sft", "defaults"): code that needs a default asks here, never hard-codes one."""
    root = _schema()
    node = root
    for name in path:
        node = _resolve(node, root)["properties"][name]
    out: dict = {}
    _fill_defaults(out, node, root)
    return out


def _resolve(node: dict, root: dict) -> dict:
    while "$ref" in node and "properties" not in node:
        target = root
        for part in node["$ref"].split("/")[1:]:
            target = target[part]
        node = target
    return node


def is_hub_id(ref: str) -> bool:
    """`owner/name` read as a hub repository id (what loaders fetch when no such local folder
    exists): one slash, not a relative or absolute path."""
    return ref.count("/") == 1 and not ref.startswith((".", "/", "~"))


def _check_scale_baselines(params: dict, source: str) -> None:
    """`scales.<s>.baselines` is the folder both runners track for the scale's baselines (DVC
    cannot look into baselines.<s>): every folder and local model they read lies inside it.
    Stage checkpoints (models/...) and hub ids are the exceptions (a hub id is fetched at run
    time, untracked)."""
    from pathlib import PurePosixPath

    for scale, spec in params["scales"].items():
        entries = (params.get("baselines") or {}).get(scale) or []
        home = spec.get("baselines")
        if home is None:
            raise ConfigError(
                f"{source}: key 'scales.{scale}.baselines' is missing. Expected the folder "
                f"evaluate@{scale} tracks for its baselines: data/baselines/{scale} for kernel "
                f"folders, or data/external/<name> for models an acquire entry fetches.")
        root = PurePosixPath(home.rstrip("/"))
        for index, entry in enumerate(entries):
            path = entry.get("folder") or entry.get("model")
            if isinstance(path, dict):
                path = path.get("path")
            if not isinstance(path, str):
                continue
            local = PurePosixPath(path.rstrip("/"))
            hub_id = "model" in entry and is_hub_id(path) and local.parts[0] != "data"
            if hub_id or local.parts[0] == "models" or local == root or root in local.parents:
                continue
            raise ConfigError(
                f"{source}: key 'baselines.{scale}[{index}]' ({entry['name']}) reads {path!r}, "
                f"outside 'scales.{scale}.baselines' ({home!r}), so evaluate@{scale} would not "
                f"re-run when it changes. Expected a path inside {home!r}, or set "
                f"'scales.{scale}.baselines' to a folder holding all of them.")


def _check_scale_bases(params: dict, source: str) -> None:
    """`scales.<s>.base` is the path both runners track as the scale's base model (DVC cannot
    look up models.<model>.path from a scale): it must be the folder the model is read from."""
    for scale, spec in params["scales"].items():
        model = params["models"][spec["model"]]
        base = spec.get("base")
        if base is None or model["kind"] == "tiny":
            continue
        if model.get("path") != base:
            raise ConfigError(
                f"{source}: key 'scales.{scale}.base' is {base!r} but its model "
                f"'models.{spec['model']}.path' is {model.get('path')!r}. Expected them to be the "
                f"same folder (data/external/<name>, written by acquire@<name>).")


def corpus_settings(section: dict, corpus: str) -> dict:
    """A corpus-keyed section (augment, assemble) as it resolves for `corpus`: its keys, then
    its `overrides.<corpus>` entry's."""
    settings = {k: v for k, v in section.items() if k != "overrides"}
    return {**settings, **(section.get("overrides") or {}).get(corpus, {})}
