# A benchmark suite as a table: a tracked output, so a hub download is versioned like any
# stage output and evaluation depends on the exact tasks it scored.


rule benchmark:
    input:
        source=benchmark_inputs,
        code=code("stages/benchmark.py"),
    output:
        "data/benchmark/{benchmark}.parquet",
    log:
        "logs/benchmark/{benchmark}.log",
    conda:
        "../../envs/dicepipe.yaml"
    params:
        tracked=tracked("benchmarks.{benchmark}"),
        generation=output_generation("benchmark"),
    shell:
        "dicepipe benchmark --name {wildcards.benchmark} --out {output} --log {log}"
