# A scale's training curves (SFT loss, RL reward/updates/KL/validation) as plots for the
# report, the run on one page (summary.html: training in words, the KernelBench row beside
# the baselines', the curves, both tables) and the KernelBench tables as HTML; DVC plots the
# same TSVs itself.


rule curves:
    input:
        sft="metrics/sft/{scale}/steps.tsv",
        rl_infill_steps="metrics/rl_infill/{scale}/steps.tsv",
        rl_infill_val="metrics/rl_infill/{scale}/val.tsv",
        rl_e2e_steps="metrics/rl_e2e/{scale}/steps.tsv",
        rl_e2e_val="metrics/rl_e2e/{scale}/val.tsv",
        # for summary.html: what each stage says it did, and the evaluation tables
        sft_summary="metrics/sft/{scale}/summary.json",
        rl_infill_summary="metrics/rl_infill/{scale}/summary.json",
        rl_e2e_summary="metrics/rl_e2e/{scale}/summary.json",
        results="results/kernelbench_{scale}.csv",
        compare="results/kernelbench_compare_{scale}.csv",
        code=code("stages/curves.py"),
    output:
        # the report's first result: its category sorts before the others
        summary=report(
            "metrics/curves/{scale}/summary.html",
            caption="../report/summary.rst",
            category="At a glance",
            subcategory="{scale}",
        ),
        # both KernelBench tables as HTML (the report shows a CSV only as a download)
        tables=report(
            "metrics/curves/{scale}/kernelbench_tables.html",
            caption="../report/tables.rst",
            category="KernelBench",
            subcategory="{scale}",
        ),
        sft=report(
            "metrics/curves/{scale}/sft.png",
            caption="../report/sft_curves.rst",
            category="Training",
            subcategory="{scale}",
        ),
        rl_infill=report(
            "metrics/curves/{scale}/rl_infill.png",
            caption="../report/rl_curves.rst",
            category="Training",
            subcategory="{scale}",
        ),
        rl_e2e=report(
            "metrics/curves/{scale}/rl_e2e.png",
            caption="../report/rl_curves.rst",
            category="Training",
            subcategory="{scale}",
        ),
    log:
        "logs/curves/{scale}.log",
    conda:
        "../../envs/dicepipe.yaml"
    params:
        tracked=tracked(),
        generation=output_generation("curves"),
    shell:
        "dicepipe curves --scale {wildcards.scale} --sft metrics/sft/{wildcards.scale}"
        " --rl-infill metrics/rl_infill/{wildcards.scale} --rl-e2e metrics/rl_e2e/{wildcards.scale}"
        " --results {input.results} --compare {input.compare}"
        " --out metrics/curves/{wildcards.scale} --log {log}"
