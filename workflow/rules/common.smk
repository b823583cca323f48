# Helpers shared by all rule files. Schema validation, wildcard constraints, the params each
# rule tracks, and the code each rule depends on.
import re
from pathlib import Path

import yaml

import dicepipe.config as dicepipe_config
from dicepipe.cluster import job_resources
from dicepipe.deps import harness_param_keys, stage_code
from snakemake.utils import validate

# Both runners must read the same values: the CLI reads params.yaml itself, so a value set
# with --config/--configfile would reach Snakemake's bookkeeping but not the stage.
with open("params.yaml") as _fh:
    _on_disk = yaml.safe_load(_fh)
for _key, _value in _on_disk.items():
    if config.get(_key) != _value:
        raise ValueError(
            f"config key {_key!r} differs from params.yaml. Both Snakemake and DVC read "
            "params.yaml: change the value there instead of with --config/--configfile."
        )

# The package's own check first: its message names the key, the value and the rule broken
# ("must be greater than 0"); then Snakemake's, which fills the schema's defaults into config.
dicepipe_config.validate_params(config, "params.yaml")
validate(config, str(dicepipe_config.SCHEMA_PATH))

SCALES = list(config["scales"])
CORPORA = list(config["corpora"])
SHARDS = list(config["verify"]["shards"])
# The harness settings that change a measurement; the rest (cache folder, build workers,
# precompiled headers, build timeout) is never tracked.
HARNESS_MEASUREMENT = harness_param_keys()
# Those plus the judgement keys (harness.robust), only for rules whose stage reads them.
HARNESS_JUDGED = harness_param_keys(judgement=True)


def lookup_key(dotted, wildcards):
    """Resolve a dotted params key; {corpus}/{scale}/{model} come from the wildcards."""
    names = dict(wildcards.items())
    if "scale" in names:
        names["model"] = config["scales"][names["scale"]]["model"]
        names.setdefault("corpus", config["scales"][names["scale"]]["corpus"])
    key = dotted.format(**names)
    return key, dicepipe_config.lookup(config, key)


def tracked(*keys):
    """The params a rule's stage reads (the same keys its DVC stage lists), as one value
    Snakemake compares between runs: editing any of them re-runs the rule, nothing else does.
    """

    def _params(wildcards):
        return dict(lookup_key(k, wildcards) for k in keys)

    return _params


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
            keyed = {key: wildcards[key]}
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


def source_inputs(wildcards):
    source = config["corpora"][wildcards.corpus]["source"]
    return [] if source["kind"] == "hub" else [source["path"]]


BENCHMARKS = list(config["benchmarks"])


def benchmark_inputs(wildcards):
    """The local source of a benchmark (a hub dataset id has none: the stage downloads it)."""
    spec = config["benchmarks"][wildcards.benchmark]
    return [] if spec["kind"] == "hub" else [spec["path"]]


def scale_benchmark_table(wildcards):
    return f"data/benchmark/{config['scales'][wildcards.scale]['benchmark']}.parquet"


# The checkpoint evaluate@<scale> scores: the last training stage's output. The one place
# to change it here; dvc.yaml's `vars: eval_model_stage` is the other runner's.
EVAL_MODEL_STAGE = "rl_e2e"


def eval_model_dir(wildcards):
    return f"models/{EVAL_MODEL_STAGE}/{wildcards.scale}"
