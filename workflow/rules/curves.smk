# A scale's training curves (SFT loss, RL reward/updates/KL/validation) as plots for the
# report; DVC plots the same TSVs itself.


rule curves:
    input:
        sft="metrics/sft/{scale}/steps.tsv",
        rl_infill_steps="metrics/rl_infill/{scale}/steps.tsv",
        rl_infill_val="metrics/rl_infill/{scale}/val.tsv",
        rl_e2e_steps="metrics/rl_e2e/{scale}/steps.tsv",
        rl_e2e_val="metrics/rl_e2e/{scale}/val.tsv",
        code=code("stages/curves.py"),
    output:
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
    shell:
        "dicepipe curves --scale {wildcards.scale} --sft metrics/sft/{wildcards.scale}"
        " --rl-infill metrics/rl_infill/{wildcards.scale} --rl-e2e metrics/rl_e2e/{wildcards.scale}"
        " --out metrics/curves/{wildcards.scale} --log {log}"
