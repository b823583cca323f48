rule augment:
    input:
        code("stages/augment.py", "augment", "harness"),
    output:
        structural="data/augment/{corpus}/structural.parquet",
        attempts="data/augment/{corpus}/attempts.parquet",
        report="data/augment/{corpus}/report.json",
    log:
        "logs/augment/{corpus}.log",
    conda:
        "../../envs/dicepipe.yaml"
    threads: workflow.cores
    resources:
        gpu=lambda wc: int(corpus_backend(wc.corpus) == "cuda"),
        mem_mb=8000,
    params:
        tracked=tracked("corpora.{corpus}", "augment", "harness", "tolerance_profiles"),
    shell:
        "dicepipe augment --corpus {wildcards.corpus} --out data/augment/{wildcards.corpus}"
        " --log {log}"
