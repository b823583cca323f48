"""The schema is the one home of every default: a params.yaml whose sections are
empty (the least the schema requires) builds every settings object with the schema's
defaults, through the one resolver (config.stage_settings); and no dataclass built from
params carries a default of its own for a params-backed field."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

# The least a valid params.yaml holds: one scale and what it names, the keys the schema
# requires, every settings section empty ({}: `defaults: {}`, an `overrides` entry per scale).
MINIMAL = """
scales:
  tiny: {corpus: seed, model: tiny, backend: cpu, benchmark: seed,
         prompts: data/external/KernelBench, baselines: data/baselines/tiny}
corpora:
  seed: {backend: cpu, source: {kind: pairs_dir, path: data/seed/corpus}}
benchmarks:
  seed: {kind: kernelbench_dir, path: data/seed/benchmark}
models:
  tiny: {kind: tiny, block_size: 4}
protocols:  # the ones the defaults name (evaluate.protocols, every stage's `protocol`)
  kernelbench: {check: kernelbench, trials: 5, fp32: 0.0001, low_precision: 0.01}
  kernelbench_v0: {check: kernelbench, trials: 5, fp32: 0.01, low_precision: 0.01}
  strict: {check: strict, fp32: 0.0001, low_precision: 0.01}
harness: {}
verify: {}
augment: {}
assemble: {}
sft: {defaults: {}, overrides: {tiny: {}}}
rl:
  defaults: {}
  stages:
    rl_infill: {prompt: infill, steps: 1, max_prompt_tokens: 64}
    rl_e2e: {prompt: e2e, steps: 1, max_prompt_tokens: 64}
  overrides: {tiny: {}}
evaluate: {defaults: {}, overrides: {tiny: {}}}
baselines: {tiny: []}
"""


@pytest.fixture()
def minimal(tmp_path) -> dict:
    from dicepipe.config import load_params

    path = tmp_path / "params.yaml"
    path.write_text(MINIMAL)
    return load_params(path)


def test_every_settings_object_from_empty_sections_takes_the_schemas_defaults(minimal):
    from dicepipe.augment import generate_tasks
    from dicepipe.augment.authors import make_author
    from dicepipe.config import schema_defaults, stage_settings
    from dicepipe.model.generate import GenerationSettings
    from kernelharness import HarnessSettings

    # the harness: every params-backed field is the schema's
    harness = dataclasses.asdict(HarnessSettings.from_params(minimal["harness"]))
    defaults = schema_defaults("harness")
    for part in ("measure", "run"):
        for name, value in defaults[part].items():
            assert harness[name] == value, f"harness.{part}.{name}"
    # the layered sections, through the one resolver
    evaluate = stage_settings(minimal, "evaluate", scale="tiny")
    assert evaluate == schema_defaults("evaluate", "defaults")
    assert evaluate["repeats"] == 3 and evaluate["batch_size"] == 64  # no KeyError, no 32
    generation = dataclasses.asdict(GenerationSettings.from_params(evaluate, "evaluate (tiny)"))
    assert generation == {k: evaluate[k] for k in generation}
    assert stage_settings(minimal, "sft", scale="tiny") == schema_defaults("sft", "defaults")
    for stage in ("rl_infill", "rl_e2e"):
        rl = stage_settings(minimal, "rl", stage=stage, scale="tiny")
        assert rl == {**schema_defaults("rl", "defaults"), **minimal["rl"]["stages"][stage]}
    # the flat sections: load_params filled the schema's defaults in
    for section in ("verify", "augment", "assemble", "ingest", "score"):
        assert minimal[section] == schema_defaults(section), section
    from dicepipe.config import load_schema

    assert minimal["models"]["tiny"]["seed"] == \
        load_schema()["$defs"]["model"]["properties"]["seed"]["default"]
    # and what the stages build from them
    assert generate_tasks(minimal["augment"], "cpu")
    assert make_author(minimal["augment"], "cpu").name == "templates"
    section = minimal["verify"]
    verify = HarnessSettings.from_params(minimal["harness"], repeats=section["repeats"],
                                         decision_thresholds=section["decision_thresholds"])
    assert verify.repeats == 5 and verify.decision_thresholds == (1.5, 2.0, 2.5)


def test_the_resolver_layers_defaults_stage_and_scale(params):
    from dicepipe.config import schema_defaults, stage_settings
    from dicepipe.errors import ConfigError

    rl = stage_settings(params, "rl", stage="rl_infill", scale="tiny")
    assert rl["steps"] == params["rl"]["overrides"]["tiny"]["steps"]  # the scale wins
    assert rl["prompt"] == "infill"  # the stage's own
    assert rl["clip_eps"] == params["rl"]["defaults"]["clip_eps"]
    partial = {"sft": {"defaults": {"epochs": 7}, "overrides": {"tiny": {"seed": 3}}}}
    sft = stage_settings(partial, "sft", scale="tiny")
    assert sft == {**schema_defaults("sft", "defaults"), "epochs": 7, "seed": 3}
    with pytest.raises(ConfigError, match="rl.stages.rl_nope"):
        stage_settings(params, "rl", stage="rl_nope", scale="tiny")
    with pytest.raises(ConfigError, match="augment"):
        stage_settings(params, "augment")


def test_harness_settings_name_an_unknown_key(params):
    from dicepipe.errors import HarnessError
    from kernelharness import HarnessSettings

    with pytest.raises(HarnessError, match=r"harness.measure: unknown keys \['bogus'\]"):
        HarnessSettings.from_params({"measure": {"bogus": 1}})


# --- no default outside the schema (AST) -----------------------------------------------------

# Dataclasses built from params and the schema sections backing their fields.
PARAMS_BACKED = {
    "HarnessSettings": ("harness.measure", "harness.run"),
    "BuildOptions": ("harness.run",),  # HarnessSettings.build_options
    "GenerationSettings": ("evaluate.defaults",),
    "Scale": ("scales.*",),
    "Protocol": ("protocols.*",),
    "KernelReward": ("rl.defaults",),
}
# Dataclasses whose field names look like params keys but which params never build directly.
NOT_PARAMS_BACKED = {
    # the decoder's own settings: evaluation (GenerationSettings) and RL
    # (train/rl_rollout.decode_settings) pass every params-backed field; its defaults serve the
    # decoder's direct callers (tests, benchmark scripts)
    "DecodeSettings",
}
# A params-backed field whose default is not a params value, with the reason.
EXEMPT = {
    # a strict-check protocol has no trials (the schema requires them for the kernelbench check
    # only): 0 says "none"
    ("Protocol", "trials"),
}


def _dataclasses(package_dir: Path):
    for path in sorted(package_dir.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef) and any(
                    "dataclass" in ast.unparse(d) for d in node.decorator_list):
                fields = {n.target.id: n.value for n in node.body
                          if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
                          and "ClassVar" not in ast.unparse(n.annotation)}
                methods = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
                yield path, node.name, fields, methods


def _section_keys(dotted: str) -> set[str]:
    from dicepipe.config import load_schema

    schema = load_schema()
    node = schema
    for name in dotted.split("."):
        node = _resolve(node, schema)
        node = node.get("additionalProperties") if name == "*" else node["properties"][name]
    node = _resolve(node, schema)
    return set(node.get("properties", {}))


def _resolve(node: dict, schema: dict) -> dict:
    if "$ref" not in node:
        return node
    target = schema
    for part in node["$ref"].split("/")[1:]:
        target = target[part]
    target = _resolve(target, schema)
    return {**target, **{k: v for k, v in node.items() if k != "$ref"},
            "properties": {**target.get("properties", {}), **node.get("properties", {})}}


def _all_sections() -> dict[str, set[str]]:
    from dicepipe.config import load_schema

    schema, found = load_schema(), {}

    def walk(node, path):
        node = _resolve(node, schema) if isinstance(node, dict) else node
        if not isinstance(node, dict) or len(path) > 5:
            return
        if node.get("properties"):
            found[".".join(path)] = set(node["properties"])
            for name, sub in node["properties"].items():
                walk(sub, path + [name])
        if isinstance(node.get("additionalProperties"), dict):
            walk(node["additionalProperties"], path + ["*"])

    walk(schema, [])
    return found


def default_problems(*packages: Path) -> list[str]:
    """Params-backed dataclass fields with a default of their own, and dataclasses that look
    built from params but are in neither list (over the pipeline's and the harness's code)."""
    sections = _all_sections()
    found, problems = set(), []
    for path, name, fields, methods in (d for package in packages for d in _dataclasses(package)):
        found.add(name)
        overlap = max((len(set(fields) & keys) for keys in sections.values()), default=0)
        looks_backed = "from_params" in methods or (overlap >= 4 and 2 * overlap >= len(fields))
        if looks_backed and name not in PARAMS_BACKED and name not in NOT_PARAMS_BACKED:
            problems.append(f"{path.name}:{name} is built from params (or looks so): add it to "
                            "PARAMS_BACKED with its schema sections, or to NOT_PARAMS_BACKED")
        if name not in PARAMS_BACKED:
            continue
        keys = set().union(*(_section_keys(s) for s in PARAMS_BACKED[name]))
        problems += [f"{path.name}:{name}.{field} = {ast.unparse(default)}: a default written "
                     f"outside the schema (params key of {PARAMS_BACKED[name]})"
                     for field, default in fields.items()
                     if field in keys and default is not None and (name, field) not in EXEMPT]
    problems += [f"{n}: no such dataclass" for n in set(PARAMS_BACKED) - found]
    return problems


def test_no_params_backed_dataclass_field_has_a_default(repo_root):
    problems = default_problems(repo_root / "workflow" / "dicepipe",
                                repo_root / "harness" / "src" / "kernelharness")
    assert not problems, "\n".join(problems)


def test_the_scan_finds_a_default_written_outside_the_schema(repo_root, tmp_path):
    import shutil

    package = tmp_path / "dicepipe"
    shutil.copytree(repo_root / "workflow" / "dicepipe", package,
                    ignore=shutil.ignore_patterns("__pycache__"))
    generate = package / "model" / "generate.py"
    text = generate.read_text()
    assert "    batch_size: int\n" in text
    generate.write_text(text.replace("    batch_size: int\n", "    batch_size: int = 32\n"))
    (package / "new_settings.py").write_text(
        "from dataclasses import dataclass\n\n\n@dataclass\nclass SFTSettings:\n"
        "    epochs: int = 3\n\n    @classmethod\n    def from_params(cls, values):\n"
        "        return cls(**values)\n")
    problems = default_problems(package, repo_root / "harness" / "src" / "kernelharness")
    assert any("GenerationSettings.batch_size = 32" in p for p in problems), problems
    assert any("SFTSettings is built from params" in p for p in problems), problems


def test_with_defaults_and_the_sft_filler_are_the_schemas(params):
    from dicepipe.config import schema_defaults
    from kernelharness import HarnessSettings
    from dicepipe.train.sft import with_defaults

    assert with_defaults({}) == schema_defaults("sft", "defaults")
    assert HarnessSettings.with_defaults() == HarnessSettings.from_params({})
