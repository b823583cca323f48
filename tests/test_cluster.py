"""Scale-out: per-job resources from params.yaml, the SLURM profile's dry run with the executor
plugin (the sbatch options each job would get), and the torchrun self-launch of training
stages."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from pathlib import Path

import pytest
from dag_tools import copy_workflow
from dicepipe.cluster import job_resources
from dicepipe.train.launch import needs_relaunch, torchrun_command, under_torchrun

BIN = Path(sys.executable).parent


def test_job_resources_take_stage_scale_and_default_entries(params):
    p = copy.deepcopy(params)
    assert job_resources(p, "sft", scale="8b") == {"gpu": 8, "cpus_per_task": 64,
                                                    "mem_mb": 512000, "runtime": 2880}
    # the tiny scale overrides its fields and, on the cpu backend, asks for no GPU
    assert job_resources(p, "sft", scale="tiny") == {"gpu": 0, "cpus_per_task": 2,
                                                      "mem_mb": 8000, "runtime": 60}
    # data stages: the GPUs of their entry on a cuda corpus, none on a cpu corpus
    assert job_resources(p, "verify", corpus="concur")["gpu"] == 1
    assert job_resources(p, "verify", corpus="seed")["gpu"] == 0
    # a stage without an entry takes `default`
    assert job_resources(p, "ingest", corpus="concur") == {
        "gpu": 0, "cpus_per_task": 1, "mem_mb": 4000, "runtime": 60}
    p["scales"]["4b"]["gpus"] = 2
    assert job_resources(p, "sft", scale="4b")["gpu"] == 2
    p["resources"]["sft"]["scales"] = {"4b": {"gpus": 4}}
    assert job_resources(p, "sft", scale="4b")["gpu"] == 4


def test_torchrun_launch_decision():
    rank_env = {"TORCHELASTIC_RUN_ID": "x", "LOCAL_RANK": "0", "RANK": "0", "WORLD_SIZE": "2"}
    assert under_torchrun(rank_env) and not under_torchrun({})
    assert needs_relaunch(8, environ={}) and not needs_relaunch(8, environ=rank_env)
    assert not needs_relaunch(1, environ={}) and needs_relaunch(1, force=True, environ={})
    command = torchrun_command(["sft", "--scale", "8b"], 8, python="py")
    assert command == ["py", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                       "8", "-m", "dicepipe.cli", "--", "sft", "--scale", "8b"]


def _dry_run_jobs(text: str) -> list[dict]:
    """(rule, wildcards, resources) of every job a `snakemake -n` printout lists."""
    jobs = []
    for block in re.split(r"\n(?=rule \w+:)", text):
        head = re.match(r"rule (\w+):", block)
        found = {k: re.search(rf"^\s+{k}: (.*)$", block, re.MULTILINE) for k in ("wildcards", "resources")}
        if not head or not found["resources"]:
            continue
        pairs = lambda line: dict(item.split("=", 1) for item in line.split(", "))
        jobs.append({"rule": head.group(1),
                     "wildcards": pairs(found["wildcards"].group(1)) if found["wildcards"] else {},
                     "resources": pairs(found["resources"].group(1))})
    return jobs


class _Resources(dict):
    """What the SLURM plugin reads from a job: `.get(name)` and attribute access."""

    def __getattr__(self, name):
        return self[name]


def _sbatch_options(resources: dict, threads: int) -> str:
    from types import SimpleNamespace

    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string

    job = SimpleNamespace(resources=_Resources(resources), threads=threads)
    params = {"run_uuid": "run", "slurm_logfile": "log", "comment_str": "c", "account": "",
              "partition": "", "workdir": "."}
    return get_submit_command(job, params) + set_gres_string(job)


@pytest.mark.timeout(300)
def test_slurm_profile_dry_run_gives_each_job_its_resources(repo_root, params, tmp_path):
    """The README's cluster command, as a dry run with the executor plugin: every job of the
    8b and tiny targets asks for what params.yaml says, and the plugin turns that into the
    sbatch options (--gpus, --cpus-per-task, --mem, --time)."""
    pytest.importorskip("snakemake_executor_plugin_slurm")
    ws = copy_workflow(repo_root, tmp_path)
    result = subprocess.run(
        [BIN / "snakemake", "--profile", "profiles/slurm", "--workflow-profile", "none", "-n",
         "--", "models/sft/8b", "models/sft/tiny"], cwd=ws, capture_output=True, text=True,
        check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    jobs = _dry_run_jobs(result.stdout + result.stderr)
    assert {"ingest", "verify", "verify_gather", "augment", "assemble", "sft"} <= {
        j["rule"] for j in jobs}
    for job in jobs:
        wc = job["wildcards"]
        key = ({"scale": wc["scale"]} if "scale" in wc else
               {"corpus": wc["corpus"]} if "corpus" in wc else {})  # acquire: neither
        want = job_resources(params, job["rule"], **key)
        got = {name: int(job["resources"][name]) for name in want}
        assert got == want, (job["rule"], wc)
        assert job["resources"]["slurm_partition"] == "gpu"
        sbatch = _sbatch_options(got, threads=want["cpus_per_task"])
        assert f"--cpus-per-task={want['cpus_per_task']}" in sbatch
        assert f"--mem {want['mem_mb']}" in sbatch and f"-t {want['runtime']}" in sbatch
        assert (f"--gpus={want['gpu']}" in sbatch) == (want["gpu"] > 0), sbatch
    sft_8b = next(j for j in jobs if j["rule"] == "sft" and j["wildcards"]["scale"] == "8b")
    assert int(sft_8b["resources"]["gpu"]) == params["scales"]["8b"]["gpus"] == 8
