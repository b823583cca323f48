"""Honest inputs on a real GPU (marked `gpu`): freed memory is scrubbed before the candidate
runs, and a candidate serving outputs by input address shows no speedup."""

from __future__ import annotations

import pytest
import torch
from kernelharness import evaluate
from kernelharness.worker import correctness as C
from test_gpu import CUDA_KIT
from kernelharness.testing import RELU_REF, by_id, job, settings

pytestmark = pytest.mark.gpu

REF = RELU_REF.replace("torch.rand(64, 256)", "torch.rand(8192, 8192)")
# relu(x) is an intermediate, freed before `* 1.0` returns: an unwritten output of the same
# size lands on it unless the free blocks are scrubbed
REF_WITH_INTERMEDIATE = REF.replace("torch.relu(x)", "torch.relu(x) * 1.0")
NO_OP = ("import torch\nclass ModelNew(torch.nn.Module):\n"
         "    def forward(self, x):\n        return torch.empty_like(x)\n")
CACHE_BY_ADDRESS = CUDA_KIT.replace(
    "    def __init__(self):\n        super().__init__()\n",
    "    def __init__(self):\n        super().__init__()\n        self.calls = 0\n"
    "        self.cache = {}\n").replace(
    "        return kit.{call}(x)",
    "        self.calls += 1\n        key = x.data_ptr()\n"
    "        if self.calls > 10 and key in self.cache:\n"
    "            return self.cache[key].clone()\n"
    "        self.cache[key] = kit.relu(x)\n        return self.cache[key]")


def test_scrub_overwrites_freed_blocks():
    x = torch.full((1 << 20,), 7.0, device="cuda")
    address = x.data_ptr()
    del x
    C.scrub_free_memory("cuda")
    y = torch.empty(1 << 20, device="cuda")
    assert y.data_ptr() == address  # the caching allocator hands the same block back
    assert not (y == 7.0).any()


@pytest.fixture(scope="module")
def rows(build_cache_dir):
    jobs = [job("relu", REF, CUDA_KIT.replace("{call}", "relu"), "cuda"),
            job("no_op", REF_WITH_INTERMEDIATE, NO_OP, "cuda"),
            job("cache_by_address", REF, CACHE_BY_ADDRESS, "cuda")]
    cfg = settings(build_cache_dir, timing_trials=30, memory_limit_mb=16384)
    return by_id(evaluate(jobs, cfg, progress=False))


def test_honest_kernel_checked_and_timed(rows):
    row = rows["relu"]
    assert row["correct_robust"], row["error"]
    assert row["tolerance_needed"] == 0.0 and row["timed_outputs_checked"] >= 2


def test_unwritten_output_finds_no_reference_result(rows):
    row = rows["no_op"]
    assert not row["correct"] and row["tolerance_needed"] == float("inf"), row["error"]


def test_address_cache_shows_no_speedup(rows):
    row = rows["cache_by_address"]
    assert not row["correct"] and row["speedup_median"] is None, row["error"]
    assert "cache" in row["error"]
