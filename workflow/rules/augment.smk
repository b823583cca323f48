rule augment:
    input:
        code("stages/augment.py"),
    output:
        structural="data/augment/{corpus}/structural.parquet",
        attempts="data/augment/{corpus}/attempts.parquet",
        report="data/augment/{corpus}/report.json",
    log:
        "logs/augment/{corpus}.log",
    conda:
        "../../envs/dicepipe.yaml"
    threads: threads_of("augment", "corpus")
    resources:
        **resources_of("augment", "corpus"),
    params:
        tracked=tracked(
            "corpora.{corpus}", "augment", *HARNESS_MEASUREMENT, "protocols"
        ),
        generation=output_generation("augment"),
    shell:
        "dicepipe augment --corpus {wildcards.corpus} --out data/augment/{wildcards.corpus}"
        " --log {log}"
