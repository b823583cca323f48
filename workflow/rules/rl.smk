# BiC-RL: stage 1 (kernel infilling, from the SFT checkpoint) and stage 2 (end to end, from
# stage 1); evaluation takes models/rl_e2e/{scale}. One implementation (dicepipe/train/rl.py),
# two subcommands; model selection on the held-out val split, never the benchmark.


rule rl_infill:
    input:
        model="models/sft/{scale}",
        data=lambda wc: f"data/cuke/{scale_corpus(wc)}/rl_infill.parquet",
        val=lambda wc: f"data/cuke/{scale_corpus(wc)}/val.parquet",
        code=code("stages/rl_infill.py"),
    output:
        model=directory("models/rl_infill/{scale}"),
        summary="metrics/rl_infill/{scale}/summary.json",
        steps="metrics/rl_infill/{scale}/steps.tsv",
        val="metrics/rl_infill/{scale}/val.tsv",
    log:
        "logs/rl_infill/{scale}.log",
    conda:
        "../../envs/dicepipe.yaml"
    threads: threads_of("rl_infill", "scale")
    resources:
        **resources_of("rl_infill", "scale"),
    params:
        tracked=tracked(
            "scales.{scale}",
            "rl.defaults",
            "rl.stages.rl_infill",
            "rl.overrides.{scale}",
            "protocols",
            *HARNESS_MEASUREMENT,
        ),
        generation=output_generation("rl_infill"),
    shell:
        "dicepipe rl-infill --scale {wildcards.scale} --model {input.model} --data {input.data}"
        " --val {input.val} --out {output.model} --metrics metrics/rl_infill/{wildcards.scale}"
        " --log {log}"


rule rl_e2e:
    input:
        model="models/rl_infill/{scale}",
        data=lambda wc: f"data/cuke/{scale_corpus(wc)}/rl_e2e.parquet",
        val=lambda wc: f"data/cuke/{scale_corpus(wc)}/val.parquet",
        code=code("stages/rl_e2e.py"),
    output:
        model=directory("models/rl_e2e/{scale}"),
        summary="metrics/rl_e2e/{scale}/summary.json",
        steps="metrics/rl_e2e/{scale}/steps.tsv",
        val="metrics/rl_e2e/{scale}/val.tsv",
    log:
        "logs/rl_e2e/{scale}.log",
    conda:
        "../../envs/dicepipe.yaml"
    threads: threads_of("rl_e2e", "scale")
    resources:
        **resources_of("rl_e2e", "scale"),
    params:
        tracked=tracked(
            "scales.{scale}",
            "rl.defaults",
            "rl.stages.rl_e2e",
            "rl.overrides.{scale}",
            "prompt_sources",
            "protocols",
            *HARNESS_MEASUREMENT,
        ),
        generation=output_generation("rl_e2e"),
    shell:
        "dicepipe rl-e2e --scale {wildcards.scale} --model {input.model} --data {input.data}"
        " --val {input.val} --out {output.model} --metrics metrics/rl_e2e/{wildcards.scale}"
        " --log {log}"
