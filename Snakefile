# The DICE pipeline for Snakemake. The same stages, commands and params are in dvc.yaml;
# tests/test_parity.py keeps the two equal. Every stage is a `dicepipe` subcommand.
from snakemake.utils import min_version

min_version("9.0")


configfile: "params.yaml"


include: "workflow/rules/common.smk"


wildcard_constraints:
    scale="|".join(re.escape(s) for s in SCALES),
    corpus="|".join(re.escape(c) for c in CORPORA),
    shard="|".join(re.escape(s) for s in SHARDS),
    benchmark="|".join(re.escape(b) for b in BENCHMARKS),


include: "workflow/rules/ingest.smk"
include: "workflow/rules/verify.smk"
include: "workflow/rules/augment.smk"
include: "workflow/rules/assemble.smk"
include: "workflow/rules/sft.smk"
include: "workflow/rules/rl.smk"
include: "workflow/rules/benchmark.smk"
include: "workflow/rules/evaluate.smk"


rule all:
    default_target: True
    input:
        expand("results/kernelbench_{scale}.csv", scale=config["default_scales"]),
