rule sft:
    input:
        data=lambda wc: f"data/cuke/{scale_corpus(wc)}/sft.parquet",
        base=base_model_input,
        code=code("stages/sft.py"),
    output:
        model=directory("models/sft/{scale}"),
        summary="metrics/sft/{scale}/summary.json",
        steps="metrics/sft/{scale}/steps.tsv",
    log:
        "logs/sft/{scale}.log",
    conda:
        "../../envs/dicepipe.yaml"
    threads: threads_of("sft", "scale")
    resources:
        **resources_of("sft", "scale"),
    params:
        tracked=tracked(
            "scales.{scale}.model",
            "scales.{scale}.gpus",
            "scales.{scale}.launch",
            "models.{model}",
            "sft.defaults",
            "sft.overrides.{scale}",
        ),
        generation=output_generation("sft"),
    shell:
        "dicepipe sft --scale {wildcards.scale} --data {input.data} --out {output.model}"
        " --metrics metrics/sft/{wildcards.scale} --log {log}"
