# External inputs (params.yaml `acquire`), each fetched into data/external/<name>/ and checked
# against its pin; the stages reading them take the folder as input (acquired_input).


rule acquire:
    input:
        code=code("stages/acquire.py"),
    output:
        directory("data/external/{external}"),
    log:
        "logs/acquire/{external}.log",
    conda:
        "../../envs/dicepipe.yaml"
    threads: threads_of("acquire", None)
    resources:
        **resources_of("acquire", None),
    params:
        tracked=tracked("acquire.{external}"),
        generation=output_generation("acquire"),
    shell:
        "dicepipe acquire --name {wildcards.external} --out {output} --log {log}"
