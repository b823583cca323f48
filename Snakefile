# The DICE pipeline for Snakemake. The same stages, commands and params are in dvc.yaml;
# tests/test_parity.py keeps the two equal. Every stage is a `dicepipe` subcommand.
from snakemake.utils import min_version

min_version("9.0")


# Read by the package first: a YAML syntax error names its line and column, as under dicepipe.
import dicepipe.config

dicepipe.config.read_params_yaml("params.yaml")

# One run at a time writes this folder's outputs, under either runner: the top-level
# snakemake joins DVC's own lock, which `dvc repro` takes too (dicepipe/runlock.py).
import dicepipe.runlock

dicepipe.runlock.for_snakemake(workflow)


configfile: "params.yaml"


include: "workflow/rules/common.smk"


wildcard_constraints:
    scale="|".join(re.escape(s) for s in SCALES),
    corpus="|".join(re.escape(c) for c in CORPORA),
    shard="|".join(re.escape(s) for s in SHARDS),
    benchmark="|".join(re.escape(b) for b in BENCHMARKS),
    external="|".join(re.escape(a) for a in ACQUIRED),


include: "workflow/rules/acquire.smk"
include: "workflow/rules/ingest.smk"
include: "workflow/rules/verify.smk"
include: "workflow/rules/augment.smk"
include: "workflow/rules/assemble.smk"
include: "workflow/rules/sft.smk"
include: "workflow/rules/rl.smk"
include: "workflow/rules/benchmark.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/curves.smk"
include: "workflow/rules/provenance.smk"


# `snakemake --report report.html`: the outputs marked report() in the rule files, with the
# captions under workflow/report/.
report: "workflow/report/workflow.rst"


rule all:
    default_target: True
    input:
        expand("results/kernelbench_{scale}.csv", scale=config["default_scales"]),
        expand("metrics/curves/{scale}/sft.png", scale=config["default_scales"]),
        expand("results/provenance_{scale}.json", scale=config["default_scales"]),


# Last, once every stage's rule exists: see common.smk's unknown_value_targets.
for _rule, _index, _output, _wildcard in unknown_value_targets(workflow.rules):

    rule:
        name:
            f"unknown_{_wildcard}_{_rule}_{_index}"
        input:
            refuse_unknown_value(_wildcard, _rule, _output),
        output:
            _output,
        log:
            f"logs/unknown_values/{_output}.log",
        wildcard_constraints:
            **{_wildcard: unknown_value_pattern(_wildcard, _output)},
        conda:
            "envs/dicepipe.yaml"
        shell:
            "false"
