# Measurement is sharded (scatter) and joined (gather). It never filters: the threshold is
# applied by assemble, so changing it never re-runs these rules.


rule verify:
    input:
        samples="data/ingest/{corpus}/samples.parquet",
        code=code("stages/verify.py"),
    output:
        "data/verify/{corpus}/shards/{shard}.parquet",
    log:
        "logs/verify/{corpus}-{shard}.log",
    conda:
        "../../envs/dicepipe.yaml"
    threads: threads_of("verify", "corpus")
    resources:
        **resources_of("verify", "corpus"),
    params:
        tracked=tracked("corpora.{corpus}", *HARNESS_MEASUREMENT, "verify", "protocols"),
        generation=output_generation("verify"),
    shell:
        "dicepipe verify --corpus {wildcards.corpus} --samples {input.samples}"
        " --shard {wildcards.shard} --out {output} --log {log}"


rule verify_gather:
    input:
        shards=expand("data/verify/{{corpus}}/shards/{shard}.parquet", shard=SHARDS),
        code=code("stages/verify_gather.py"),
    output:
        "data/verify/{corpus}/measurements.parquet",
    log:
        "logs/verify_gather/{corpus}.log",
    conda:
        "../../envs/dicepipe.yaml"
    threads: threads_of("verify_gather", "corpus")
    resources:
        **resources_of("verify_gather", "corpus"),
    params:
        tracked=tracked("verify.shards"),
        generation=output_generation("verify_gather"),
    shell:
        "dicepipe verify-gather --corpus {wildcards.corpus}"
        " --shards-dir data/verify/{wildcards.corpus}/shards --out {output} --log {log}"
