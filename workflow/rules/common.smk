# Helpers shared by all rule files. Schema validation, wildcard constraints, the params each
# rule tracks, and the code each rule depends on.
import re
from pathlib import Path

import yaml

import dicepipe.config as dicepipe_config
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

validate(config, "../schemas/params.schema.yaml")

SCALES = list(config["scales"])
CORPORA = list(config["corpora"])
SHARDS = list(config["verify"]["shards"])
PACKAGE = "workflow/dicepipe"


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


def code(*parts):
    """The package files a stage runs (DVC lists the same folders/files under deps)."""
    files = []
    for part in parts:
        path = Path(PACKAGE) / part
        files += (
            sorted(str(p) for p in path.rglob("*.py")) if path.is_dir() else [str(path)]
        )
    return files


def corpus_backend(corpus):
    return config["corpora"][corpus]["backend"]


def scale_corpus(wildcards):
    return config["scales"][wildcards.scale]["corpus"]


def source_inputs(wildcards):
    source = config["corpora"][wildcards.corpus]["source"]
    return [] if source["kind"] == "hub" else [source["path"]]
