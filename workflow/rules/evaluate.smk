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
        # what the scale's baselines read (scales.<s>.baselines): shipped kernel folders file
        # by file (DVC hashes the folder), so an edited kernel re-runs this scale's evaluation
        # only; or the acquire rule's folder of baseline models
        baselines=lambda w: folder_contents(config["scales"][w.scale]["baselines"]),
        # where the scale's prompt wording is read (scales.<s>.prompts: acquire@KernelBench's
        # folder for KernelBench's prompts)
        prompts=lambda w: folder_contents(config["scales"][w.scale]["prompts"]),
    output:
        # report(): `snakemake --report` shows these with workflow/report/ captions
        summary=report(
            "results/kernelbench_{scale}.csv",
            caption="../report/results.rst",
            category="KernelBench",
            subcategory="{scale}",
        ),
        compare=report(
            "results/kernelbench_compare_{scale}.csv",
            caption="../report/compare.rst",
            category="KernelBench",
            subcategory="{scale}",
        ),
        tables=directory("results/kernelbench_{scale}"),
        metrics="metrics/evaluate/{scale}/metrics.json",
        levels=report(
            "metrics/evaluate/{scale}/levels.png",
            caption="../report/levels.rst",
            category="KernelBench",
            subcategory="{scale}",
        ),
        speedups=report(
            "metrics/evaluate/{scale}/speedups.png",
            caption="../report/speedups.rst",
            category="KernelBench",
            subcategory="{scale}",
        ),
        compare_plot=report(
            "metrics/evaluate/{scale}/compare.png",
            caption="../report/compare_plot.rst",
            category="KernelBench",
            subcategory="{scale}",
        ),
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
        generation=output_generation("evaluate"),
    shell:
        "dicepipe evaluate --scale {wildcards.scale} --model {input.model}"
        " --benchmark {input.benchmark} --out-dir {output.tables} --summary {output.summary}"
        " --compare {output.compare} --metrics metrics/evaluate/{wildcards.scale} --log {log}"
