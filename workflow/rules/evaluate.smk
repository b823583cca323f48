# KernelBench evaluation of a scale's final model and its baselines (baselines.<scale>),
# scored in one harness session. results/kernelbench_<scale>.csv is the product.

PAPER_TABLES = "workflow/dicepipe/evaluation/paper_tables.yaml"


rule evaluate:
    input:
        model=eval_model_dir,
        benchmark=scale_benchmark_table,
        code=code("stages/evaluate.py"),
        # the paper's tables the compare table sets beside the run (package data, not code)
        paper_tables=PAPER_TABLES,
    output:
        summary="results/kernelbench_{scale}.csv",
        compare="results/kernelbench_compare_{scale}.csv",
        tables=directory("results/kernelbench_{scale}"),
        metrics="metrics/evaluate/{scale}/metrics.json",
        levels="metrics/evaluate/{scale}/levels.png",
        speedups="metrics/evaluate/{scale}/speedups.png",
        compare_plot="metrics/evaluate/{scale}/compare.png",
    log:
        "logs/evaluate/{scale}.log",
    conda:
        "../../envs/dicepipe.yaml"
    threads: threads_of("evaluate", "scale")
    resources:
        **resources_of("evaluate", "scale"),
    params:
        tracked=tracked(
            "scales.{scale}",
            "evaluate.defaults",
            "evaluate.overrides.{scale}",
            "evaluate.fast_p",
            "evaluate.pass_k",
            "evaluate.protocols",
            "evaluate.code_block",
            "baselines.{scale}",
            "prompt_sources",
            "protocols",
            *HARNESS_MEASUREMENT,
        ),
    shell:
        "dicepipe evaluate --scale {wildcards.scale} --model {input.model}"
        " --benchmark {input.benchmark} --out-dir {output.tables} --summary {output.summary}"
        " --compare {output.compare} --metrics metrics/evaluate/{wildcards.scale} --log {log}"
