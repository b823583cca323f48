rule ingest:
    input:
        source_inputs,
        code("stages/ingest.py", "data"),
    output:
        samples="data/ingest/{corpus}/samples.parquet",
        report="data/ingest/{corpus}/report.json",
    log:
        "logs/ingest/{corpus}.log",
    params:
        tracked=tracked("corpora.{corpus}", "ingest"),
    conda:
        "../../envs/dicepipe.yaml"
    resources:
        mem_mb=4000,
    shell:
        "dicepipe ingest --corpus {wildcards.corpus} --out {output.samples}"
        " --report {output.report} --log {log}"
