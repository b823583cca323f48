# Helpers shared by all rule files. Schema validation, wildcard constraints, the params each
# rule tracks, and the code each rule depends on.
import re
from pathlib import Path

import yaml

import dicepipe.config as dicepipe_config
from dicepipe.cluster import job_resources
from dicepipe.deps import (
    HARNESS_METHOD_KEY,
    harness_method_version,
    harness_param_keys,
    stage_code,
)
from dicepipe.generations import Generations
from snakemake.io import strip_wildcard_constraints

# Both runners must read the same values: the CLI reads params.yaml itself, so a value set
# with --config/--configfile would reach Snakemake's bookkeeping but not the stage.
_on_disk = dicepipe_config.read_params_yaml("params.yaml")
for _key, _value in _on_disk.items():
    if config.get(_key) != _value:
        raise ValueError(
            f"config key {_key!r} differs from params.yaml. Both Snakemake and DVC read "
            "params.yaml: change the value there instead of with --config/--configfile."
        )


def canonical(value):
    """Mappings rebuilt in key order, recursively: the repr Snakemake compares params by
    then depends on the values only, not on the order params.yaml writes them in."""
    if isinstance(value, dict):
        return {key: canonical(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [canonical(item) for item in value]
    return value


# The package's own check: its message names the key, the value and the rule broken ("must be
# greater than 0"); config gets the schema's defaults filled in (the schema includes the
# harness package's, so it is not one file Snakemake's own validate could read).
# The rules track RESOLVED: what the stages read (params.yaml with the schema's defaults).
_validated = dicepipe_config.validate_params(config, "params.yaml")
RESOLVED = canonical(_validated)
config.update(_validated)

SCALES = list(config["scales"])
CORPORA = list(config["corpora"])
SHARDS = list(config["verify"]["shards"])
# What a measurement depends on: harness.measure (tracked whole) and the harness's method
# version (HARNESS_METHOD_KEY), never the harness's source files; the rest (harness.run: cache
# folder, build workers, precompiled headers, build timeout) is never tracked.
HARNESS_MEASUREMENT = harness_param_keys()


def lookup_key(dotted, wildcards):
    """Resolve a dotted params key; {corpus}/{scale}/{model} come from the wildcards. The
    value is the resolved one (the schema's defaults filled in, mappings in key order), so
    reordering keys or deleting one whose default is its value changes nothing."""
    names = dict(wildcards.items())
    if "scale" in names:
        names["model"] = config["scales"][names["scale"]]["model"]
        names.setdefault("corpus", config["scales"][names["scale"]]["corpus"])
    key = dotted.format(**names)
    if key == HARNESS_METHOD_KEY:
        return key, harness_method_version()
    return key, dicepipe_config.lookup(RESOLVED, key)


def tracked(*keys):
    """The params a rule's stage reads (the same keys its DVC stage lists), as one value
    Snakemake compares between runs: editing any of them re-runs the rule, nothing else does.
    Snakemake compares a param by its repr, so the values are the canonical resolved ones.
    """

    def _params(wildcards):
        return dict(lookup_key(k, wildcards) for k in keys)

    return _params


# Snakemake re-plans a missing output only for a target job: every rule also tracks the
# generation of its outputs, which a planning run that finds one of them missing moves on
# (dicepipe/generations.py), so the job and everything made from it are planned again.
GENERATIONS = Generations(writable=workflow.is_main_process)


def output_generation(rule_name):
    """The generation of the job's outputs (a param of every rule)."""

    def _generation(wildcards):
        names = dict(wildcards.items())
        outputs = [
            strip_wildcard_constraints(str(o)).format(**names)
            for o in getattr(rules, rule_name).output
        ]
        return GENERATIONS.of(outputs, f"{rule_name} ({', '.join(names.values())})")

    return _generation


def code(stage_module):
    """The package files a stage runs: the import closure of dicepipe/stages/<module>.py
    (dvc.yaml lists folders/files covering the same; tests/test_parity.py checks it)."""
    return stage_code(Path(stage_module).stem)


def resources_of(stage, key):
    """Resources of one job of `stage`, keyed by the `scale` or `corpus` wildcard: gpu,
    cpus_per_task, mem_mb, runtime (params.yaml `resources:`, read by dicepipe.cluster).
    """

    def _get(name):
        def _value(wildcards):
            keyed = {key: wildcards[key]} if key else {}
            return job_resources(config, stage, **keyed)[name]

        return _value

    return {name: _get(name) for name in ("gpu", "cpus_per_task", "mem_mb", "runtime")}


def threads_of(stage, key):
    """Threads of a job: its cpus (Snakemake scales them down to --cores on one machine)."""
    return resources_of(stage, key)["cpus_per_task"]


def corpus_backend(corpus):
    return config["corpora"][corpus]["backend"]


def scale_corpus(wildcards):
    return config["scales"][wildcards.scale]["corpus"]


# External inputs fetched by the acquire rule into data/external/<name>/.
ACQUIRED = list(config.get("acquire", {}))


def acquired_input(path):
    """A path inside an acquired folder stands for that folder (the acquire rule's output:
    Snakemake matches an input to a rule's output, not to a file inside it); DVC may name the
    file itself (tests/dag_tools.py acquired_folder maps it the same way)."""
    parts = Path(path).parts
    if len(parts) >= 3 and parts[:2] == ("data", "external") and parts[2] in ACQUIRED:
        return str(Path(*parts[:3]))
    return path


def folder_contents(path):
    """The files a local input stands for. Snakemake compares a folder input by its mtime,
    which does not change when a file below it is edited, so a folder is listed file by file
    (__pycache__ and *.pyc left out, as .dvcignore leaves them out of DVC's hash of the
    folder): an edit, an addition or a removal re-plans the rule. An acquired folder stays
    whole (it is the acquire rule's output); an empty folder stands for itself."""
    folder = acquired_input(path)
    if (
        folder != path
        or Path(path).parts[:2] == ("data", "external")
        or not Path(path).is_dir()
    ):
        return [folder]
    files = sorted(
        str(f)
        for f in Path(path).rglob("*")
        if f.is_file()
        and f.suffix != ".pyc"
        and "__pycache__" not in f.relative_to(path).parts
    )
    return files or [path]


def source_inputs(wildcards):
    source = config["corpora"][wildcards.corpus]["source"]
    return [] if source["kind"] == "hub" else folder_contents(source["path"])


def base_model_input(wildcards):
    """What the scale's base model is made from (scales.<s>.base; DVC tracks the same)."""
    base = config["scales"][wildcards.scale].get("base")
    return folder_contents(base) if base else []


BENCHMARKS = list(config["benchmarks"])


def benchmark_inputs(wildcards):
    """The local source of a benchmark (a hub dataset id has none: the stage downloads it)."""
    spec = config["benchmarks"][wildcards.benchmark]
    return [] if spec["kind"] == "hub" else folder_contents(spec["path"])


def scale_benchmark_table(wildcards):
    return f"data/benchmark/{config['scales'][wildcards.scale]['benchmark']}.parquet"


# The checkpoint evaluate@<scale> scores: the last training stage's output. The one place
# to change it here; dvc.yaml's `vars: eval_model_stage` is the other runner's.
EVAL_MODEL_STAGE = "rl_e2e"


def eval_model_dir(wildcards):
    return f"models/{EVAL_MODEL_STAGE}/{wildcards.scale}"


# A target with a {scale}, {corpus}, {shard} or {benchmark} params.yaml does not name
# (results/kernelbench_nope.csv) matches no stage (the Snakefile's wildcard_constraints), so
# Snakemake would say only "No rule to produce". The Snakefile ends with one rule per such
# output whose input function raises with the valid values instead.
WILDCARD_VALUES = {
    "scale": SCALES,
    "corpus": CORPORA,
    "shard": SHARDS,
    "benchmark": BENCHMARKS,
}
WILDCARD_KEYS = {
    "scale": "scales",
    "corpus": "corpora",
    "shard": "verify.shards",
    "benchmark": "benchmarks",
}


def unknown_value_targets(rules):
    """(rule, output index, output pattern, wildcard) for every stage output that names one."""
    found = []
    for stage in list(rules):
        for index, output in enumerate(stage.output):
            pattern = strip_wildcard_constraints(str(output))
            found += [
                (stage.name, index, pattern, name)
                for name in WILDCARD_VALUES
                if f"{{{name}}}" in pattern
            ]
    return found


def unknown_value_pattern(wildcard, pattern):
    """A value that is no valid one: a plain name (no dot, so the folder output
    results/kernelbench_{scale} never takes results/kernelbench_tiny.csv) that is neither a
    valid value nor `<word>_<valid value>` before the same text (kernelbench_compare_tiny.csv
    is evaluate's), so no file a stage writes ever matches."""
    after = re.split(r"\{[^}]*\}", pattern.split(f"{{{wildcard}}}", 1)[1])
    literal = re.escape(after[0]) + ("$" if len(after) == 1 else "")
    valid = "|".join(re.escape(v) for v in WILDCARD_VALUES[wildcard])
    return rf"(?!(?:[\w-]*_)?(?:{valid}){literal})[\w-]+"


def refuse_unknown_value(wildcard, rule_name, pattern):
    def _refuse(wildcards):
        target = pattern.format(**dict(wildcards.items()))
        raise ValueError(
            f"{target}: {wildcard} {wildcards[wildcard]!r} is not in params.yaml "
            f"(`{WILDCARD_KEYS[wildcard]}`), so no rule writes it (it would be rule "
            f"{rule_name}'s output). Expected one of {WILDCARD_VALUES[wildcard]}: e.g. "
            f"`snakemake --cores 2 {pattern.format(**dict(wildcards.items(), **{wildcard: WILDCARD_VALUES[wildcard][0]}))}`, "
            f"or add it under `{WILDCARD_KEYS[wildcard]}` in params.yaml."
        )

    return _refuse
