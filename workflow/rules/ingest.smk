rule ingest:
    input:
        source_inputs,
        code("stages/ingest.py"),
    output:
        samples="data/ingest/{corpus}/samples.parquet",
        report="data/ingest/{corpus}/report.json",
    log:
        "logs/ingest/{corpus}.log",
    conda:
        "../../envs/dicepipe.yaml"
    threads: threads_of("ingest", "corpus")
    resources:
        **resources_of("ingest", "corpus"),
    params:
        tracked=tracked("corpora.{corpus}", "ingest"),
        generation=output_generation("ingest"),
    shell:
        "dicepipe ingest --corpus {wildcards.corpus} --out {output.samples}"
        " --report {output.report} --log {log}"
