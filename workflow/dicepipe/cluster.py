"""What one job of a stage asks a machine or a cluster for, from params.yaml's `resources:`.

The Snakemake rules pass the result as their `resources:` (and threads), under Snakemake's
standard names, which the SLURM executor plugin turns into sbatch options:
gpu -> --gpus, cpus_per_task -> --cpus-per-task, mem_mb -> --mem, runtime (minutes) -> --time.
Locally the `gpu` resource is a limit (profiles/default) that keeps GPU jobs from sharing a
GPU. Resources are never tracked as params: they change where a job runs, not its outputs.
"""

from __future__ import annotations



def job_resources(params: dict, stage: str, *, scale: str | None = None,
                  corpus: str | None = None) -> dict:
    """Resources of one job of `stage`, keyed by `scale` (training, evaluation) or `corpus`
    (data stages), or by neither (acquire: downloads, no GPU). Fields come from the stage's entry, then its per-scale override, else
    `resources.default`. GPUs: none on a cpu backend; otherwise the entry's `gpus`, or for a
    scale-keyed job without one, the scale's `gpus` (its training processes)."""
    table = params["resources"]
    entry = dict(table.get(stage) or {})
    per_scale = entry.pop("scales", {}) or {}
    if scale is not None:
        entry.update(per_scale.get(scale) or {})
    merged = {**table["default"], **entry}
    if scale is not None:
        spec = params["scales"][scale]
        backend = spec["backend"]
        gpus = entry["gpus"] if "gpus" in entry else spec["gpus"]
    elif corpus is not None:
        backend = params["corpora"][corpus]["backend"]
        gpus = merged["gpus"]
    else:  # keyed by neither (acquire: a download): never a GPU
        backend, gpus = "cpu", 0
    return {
        "gpu": int(gpus) if backend == "cuda" else 0,
        "cpus_per_task": int(merged["cpus"]),
        "mem_mb": int(merged["mem_mb"]),
        "runtime": int(merged["runtime_min"]),
    }


def training_processes(params: dict, scale: str) -> int:
    """Processes of a training job of `scale` (one per GPU; torchrun starts them when > 1)."""
    return int(params["scales"][scale]["gpus"])
