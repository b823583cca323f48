# What a scale's results were made from: params, package versions, the pin of every acquired
# input, the shipped KernelBench files (results/provenance_<scale>.json; a record, never
# compared for reproducibility: package versions differ between machines).


rule provenance:
    input:
        # every params.yaml edit re-runs it (DVC lists the same file as a dep)
        params="params.yaml",
        shipped=folder_contents("data/kernelbench"),
        code=code("stages/provenance.py"),
    output:
        report(
            "results/provenance_{scale}.json",
            caption="../report/provenance.rst",
            category="Provenance",
            subcategory="{scale}",
        ),
    log:
        "logs/provenance/{scale}.log",
    conda:
        "../../envs/dicepipe.yaml"
    params:
        tracked=tracked(),
        generation=output_generation("provenance"),
    shell:
        "dicepipe provenance --scale {wildcards.scale} --out {output} --log {log}"
