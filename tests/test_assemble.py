"""CuKe assembly: threshold and verdicts, held-out validation, infilling split exactness."""

from __future__ import annotations

import pytest

from dicepipe.data import assemble
from dicepipe.data.infill import split_for_infilling
from dicepipe.data.prompts import end_to_end_prompt
from dicepipe.judgement import Protocol, named_protocol

KB = named_protocol("strict")  # assemble's and augment's default

CUDA_FILE = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

# elementwise add
add_source = r"""
#include <torch/extension.h>
__global__ void k(const float* a, float* o, int n) { int i = threadIdx.x; if (i < n) o[i] = a[i]; }
torch::Tensor f(torch::Tensor a) { auto o = torch::empty_like(a); return o; }
"""  # the core ends here

add_decl = "torch::Tensor f(torch::Tensor a);"
ext = load_inline(name="e", cpp_sources=add_decl, cuda_sources=add_source, functions=["f"])


class ModelNew(nn.Module):
    def forward(self, a):
        return ext.f(a)
'''


def test_infill_split_reproduces_the_file_exactly():
    prefix, core, suffix = split_for_infilling(CUDA_FILE)
    assert prefix + core + suffix == CUDA_FILE
    assert core.startswith("add_source = r\"\"\"") and "__global__" in core
    assert "load_inline" in prefix and "load_inline(" not in prefix.split("import")[-1]
    assert suffix.lstrip().startswith("add_decl")
    assert split_for_infilling("x = 1\n") is None
    assert split_for_infilling("def broken(:\n") is None


def _sample(i, ref=None, level=1, source="seed"):
    return {"sample_id": f"s{i:02d}", "source": source, "task_name": f"t{i}", "level": level,
            "backend": "cpu", "reference_code": ref or f"class Model: pass  # {i}\n",
            "candidate_code": CUDA_FILE, "reasoning": None, "reported_speedup": None}


def _m(speedup, correct=True, robust=True, compiled=True):
    return {"compiled": compiled, "correct": correct, "correct_robust": robust, "speedup_median": speedup}


@pytest.mark.parametrize("m, why", [
    (None, "not_measured"), (_m(3, compiled=False), "not_compiled"), (_m(3, correct=False), "incorrect"),
    (_m(3, robust=False), "flagged"), (_m(None), "no_speedup"), (_m(1.9), "below_threshold"),
    (_m(2.0), "below_threshold"), (_m(2.01), "accepted"), (_m(float("nan")), "no_speedup"),
])
def test_verdicts(m, why):
    assert assemble.verdict(m, 2.0, True, KB) == why


def test_flagged_counts_when_not_robust():
    assert assemble.verdict(_m(3, robust=False), 2.0, False, KB) == "accepted"


def test_tolerance_profile_decides_without_remeasuring():
    tf32 = {**_m(3.0), "tolerance_needed": 2e-3, "output_precision": "fp32"}
    assert assemble.verdict(tf32, 2.0, True, KB) == "incorrect"
    assert assemble.verdict(tf32, 2.0, True, Protocol("strict_v0", "strict", 1e-2, 1e-2)) == "accepted"


SETTINGS = {"speedup_threshold": 2.0, "robust": True, "val_fraction": 0.25, "min_val_samples": 1, "seed": 0}


def test_assemble_splits_and_holds_out_whole_references():
    samples = [_sample(i, level=1 + i % 3) for i in range(8)]
    # two kernels for one reference: they must land on the same side of the split
    samples.append(_sample(8, ref=samples[0]["reference_code"]))
    speedups = [3.0, 1.2, 2.5, 0.8, 4.0, 2.0, 1.99, 5.0, 2.2]
    measurements = {s["sample_id"]: _m(x) for s, x in zip(samples, speedups)}
    structural = [_sample(20, source="structural", level=None)]
    splits, stats = assemble.assemble(samples, measurements, structural, SETTINGS, KB)
    assert stats["reasons"]["accepted"] == 5 and stats["reasons"]["below_threshold"] == 4
    val_refs = {r["reference_code"] for r in splits["val"]}
    assert val_refs, "validation must not be empty"
    for split in ("rl_e2e",):
        assert not val_refs & {r["reference_code"] for r in splits[split]}
    sft_ids = {r["sample_id"] for r in splits["sft"]}
    for s in samples:
        if s["reference_code"] in val_refs:
            assert s["sample_id"] not in sft_ids
    assert any(r["origin"] == "structural" for r in splits["sft"]) or any(
        r["reference_code"] == structural[0]["reference_code"] for r in splits["val"])
    levels = [r["level"] for r in splits["rl_e2e"]]
    assert levels == sorted(levels), "rl_e2e is ordered single operators first"
    for row in splits["rl_infill"]:
        assert row["prefix"] + row["core"] + row["suffix"] == row["candidate_code"]
    # deterministic and order-independent
    again, _ = assemble.assemble(list(reversed(samples)), measurements, structural, SETTINGS, KB)
    assert again == splits


def test_threshold_change_changes_only_the_kept_set():
    samples = [_sample(i) for i in range(6)]
    measurements = {s["sample_id"]: _m(x) for s, x in zip(samples, [1.6, 2.1, 2.6, 3.0, 0.5, 1.0])}
    counts = assemble.kept_at_thresholds(samples, measurements, [1.5, 2.0, 2.5], True, KB)
    assert counts == {"1.5": 4, "2.0": 3, "2.5": 2}


def test_prompt_carries_reference_and_backend_language():
    cpu, cuda = end_to_end_prompt("class Model: pass", "cpu"), end_to_end_prompt("class Model: pass", "cuda")
    assert "class Model: pass" in cpu and "OpenMP" in cpu and "__global__" in cuda


def test_an_empty_sft_split_stops_the_stage_saying_what_was_measured(tmp_path, params):
    """A machine that measures every kernel under the threshold gets an error naming the
    threshold and what each threshold would keep, not a quiet empty split."""
    import argparse

    import pyarrow as pa
    import pyarrow.parquet as pq

    from dicepipe.data.schema import SAMPLE_SCHEMA, write_table
    from dicepipe.errors import StageInputError
    from dicepipe.stages import assemble as stage

    samples = [_sample(i) for i in range(4)]
    write_table(pa.Table.from_pylist(samples, schema=SAMPLE_SCHEMA), tmp_path / "s.parquet", SAMPLE_SCHEMA)
    write_table(pa.Table.from_pylist([], schema=SAMPLE_SCHEMA), tmp_path / "a.parquet", SAMPLE_SCHEMA)
    rows = [{"job_id": s["sample_id"], **_m(1.6)} for s in samples]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "m.parquet")
    args = argparse.Namespace(corpus="seed", samples=str(tmp_path / "s.parquet"),
                              measurements=str(tmp_path / "m.parquet"),
                              structural=str(tmp_path / "a.parquet"), out_dir=str(tmp_path / "cuke"))
    with pytest.raises(StageInputError) as err:
        stage.run(args, params)
    message = str(err.value)
    assert "sft split is empty at assemble.speedup_threshold 2" in message
    assert "'1.5': 4" in message and "Lower assemble.speedup_threshold" in message


def test_a_corpus_override_changes_only_that_corpus(params):
    from dicepipe.stages.assemble import corpus_settings

    section = {**params["assemble"], "overrides": {"seed": {"min_val_samples": 7}}}
    seed, other = corpus_settings(section, "seed"), corpus_settings(section, "concur")
    assert seed["min_val_samples"] == 7 and other["min_val_samples"] == section["min_val_samples"]
    assert "overrides" not in seed and {k: v for k, v in seed.items() if k != "min_val_samples"} == \
        {k: v for k, v in other.items() if k != "min_val_samples"}


def test_sft_infill_adds_each_kernel_in_the_infilling_form_and_nothing_else():
    """assemble.sft_infill: the sft split gains, per kept kernel, the infilling prompt RL
    stage 1 asks (prefix and suffix given) answered with the same file; off, the release's
    end-to-end rows only. The RL and val splits are the same either way."""
    from dicepipe.data.prompts import infilling_prompt, response_text

    samples = [_sample(i) for i in range(10)]
    measurements = {s["sample_id"]: _m(3.0) for s in samples}
    plain, _ = assemble.assemble(samples, measurements, [], SETTINGS, KB)
    both, _ = assemble.assemble(samples, measurements, [], {**SETTINGS, "sft_infill": True}, KB)
    assert {k: v for k, v in both.items() if k != "sft"} == {k: v for k, v in plain.items() if k != "sft"}
    e2e = [r for r in both["sft"] if not r["sample_id"].endswith(":infill")]
    infill = {r["sample_id"]: r for r in both["sft"] if r["sample_id"].endswith(":infill")}
    assert e2e == plain["sft"] and len(infill) == len(plain["sft"])
    prefix, _, suffix = split_for_infilling(CUDA_FILE)
    for row in plain["sft"]:
        twin = infill[row["sample_id"] + ":infill"]
        sample = next(s for s in samples if s["sample_id"] == row["sample_id"])
        assert twin["prompt"] == infilling_prompt(sample["reference_code"], prefix, suffix, "cpu")
        assert twin["response"] == row["response"] == response_text(CUDA_FILE)
