rule assemble:
    input:
        samples="data/ingest/{corpus}/samples.parquet",
        measurements="data/verify/{corpus}/measurements.parquet",
        structural="data/augment/{corpus}/structural.parquet",
        code=code("stages/assemble.py"),
    output:
        sft="data/cuke/{corpus}/sft.parquet",
        rl_infill="data/cuke/{corpus}/rl_infill.parquet",
        rl_e2e="data/cuke/{corpus}/rl_e2e.parquet",
        val="data/cuke/{corpus}/val.parquet",
        stats="data/cuke/{corpus}/stats.json",
        plot="data/cuke/{corpus}/speedups.png",
    log:
        "logs/assemble/{corpus}.log",
    conda:
        "../../envs/dicepipe.yaml"
    threads: threads_of("assemble", "corpus")
    resources:
        **resources_of("assemble", "corpus"),
    params:
        tracked=tracked("assemble", "verify.decision_thresholds", "protocols"),
        generation=output_generation("assemble"),
    shell:
        "dicepipe assemble --corpus {wildcards.corpus} --samples {input.samples}"
        " --measurements {input.measurements} --structural {input.structural}"
        " --out-dir data/cuke/{wildcards.corpus} --log {log}"
