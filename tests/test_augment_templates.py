"""The cpu templates, built for real and checked by the harness (two kernels, so two builds;
they land in the shared build cache and the tiny pipeline run reuses them)."""

from __future__ import annotations

import copy

import pytest
from dicepipe.augment import generate_tasks
from dicepipe.augment.authors.templates import TemplateAuthor
from dicepipe.augment.loop import job_id
from dicepipe.data import extract
from kernelharness import FLAG_COLUMNS, HarnessSettings, Job, evaluate


@pytest.mark.slow
def test_cpu_templates_build_and_are_correct(params, build_cache_dir, tmp_path):
    settings = copy.deepcopy(params["augment"])
    settings["families"] = ["mlp_gated_silu", "rmsnorm_proj", "mlp_gated_gelu"]
    settings["max_tasks"] = {"cpu": 0}
    tasks = generate_tasks(settings, "cpu")
    # two shapes of each family, plus the second variant of the first task of each
    chosen = {}
    for task in tasks:
        chosen.setdefault(task.family, [])
        if len(chosen[task.family]) < 2:
            chosen[task.family].append(task)
    author = TemplateAuthor()
    jobs = []
    for family_tasks in chosen.values():
        for index, task in enumerate(family_tasks):
            for attempt in range(2 if index == 0 else 1):
                code = author.write(task, attempt).code
                jobs.append(Job(job_id(task, attempt, code), extract.normalise_code(task.reference_code),
                                code, "cpu"))
    # correctness is what is tested here: time only briefly
    quick = {"measure": dict(params["harness"]["measure"], warmup_trials=1, timing_trials=5,
                             timing_trials_cpu=5), "run": params["harness"]["run"]}
    harness = HarnessSettings.from_params(quick, cache_dir=build_cache_dir)
    table = evaluate(jobs, harness, results_path=tmp_path / "results.parquet", progress=False)
    rows = table.to_pylist()
    assert len(rows) == len(jobs) == 9
    for row in rows:
        assert row["compiled"], (row["job_id"], row["error"], row["compile_log_tail"])
        assert row["correct"] and row["correct_robust"], (row["job_id"], row["error"],
                                                          row["max_abs_error"])
        assert not any(row[flag] for flag in FLAG_COLUMNS), row["job_id"]
        assert row["speedup_median"] is not None and row["speedup_median"] > 0
    # the gated source serves both gated families: two kernels, so at most two builds
    assert sum(row["builds_total"] - row["builds_cached"] for row in rows) <= 2


@pytest.mark.gpu
@pytest.mark.slow
def test_cuda_templates_build_and_are_correct(params, build_cache_dir, tmp_path):
    settings = copy.deepcopy(params["augment"])
    settings["families"] = ["gqa_causal", "rmsnorm_proj"]
    settings["max_tasks"] = {"cuda": 2}
    author = TemplateAuthor()
    jobs = []
    for task in generate_tasks(settings, "cuda"):
        code = author.write(task, 0).code
        jobs.append(Job(job_id(task, 0, code), extract.normalise_code(task.reference_code), code,
                        "cuda"))
    harness = HarnessSettings.from_params(params["harness"], cache_dir=build_cache_dir)
    rows = evaluate(jobs, harness, results_path=tmp_path / "results.parquet",
                    progress=False).to_pylist()
    for row in rows:
        assert row["compiled"] and row["correct_robust"], (row["job_id"], row["error"])
