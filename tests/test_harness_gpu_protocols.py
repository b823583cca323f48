"""References that reject an input variant through a device-side assert, on a real GPU.

An embedding fed float indices (negated ones are out of range) and a multinomial over
weights (negated ones are invalid) both trip a CUDA device-side assert in the reference
itself. The probe finds that before any candidate runs, on a worker that is then replaced;
the candidates' trials never see those variants, the right kernels are correct under every
protocol, and a job after them on the same session runs on a healthy worker.
"""

from __future__ import annotations

import pytest
from kernelharness import HarnessSession
from dicepipe.judgement import BUILTIN_PROTOCOLS, judge, named_protocol
from kernelharness.testing import RELU_REF, by_id, job, settings

pytestmark = pytest.mark.gpu

EMBEDDING_REF = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = nn.Embedding(512, 64)

    def forward(self, idx):
        return self.table(idx.floor().long())


def get_inputs():
    return [torch.rand(16, 128) * 512]


def get_init_inputs():
    return []
'''

EMBEDDING_KERNEL = r'''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_src = r"""
#include <cuda_runtime.h>
#include <cstdint>
__global__ void gather_kernel(const float* idx, const float* table, float* out,
                              int64_t rows, int64_t dim) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= rows * dim) return;
    int64_t r = i / dim, c = i % dim;
    int64_t k = (int64_t)floorf(idx[r]);
    out[i] = table[k * dim + c];
}
void gather_launch(const float* idx, const float* table, float* out, int64_t rows, int64_t dim) {
    gather_kernel<<<(unsigned)((rows * dim + 255) / 256), 256>>>(idx, table, out, rows, dim);
}
"""

cpp_src = r"""
#include <torch/extension.h>
void gather_launch(const float* idx, const float* table, float* out, int64_t rows, int64_t dim);
torch::Tensor gather(torch::Tensor idx, torch::Tensor table) {
    auto ic = idx.contiguous();
    auto tc = table.contiguous();
    auto sizes = ic.sizes().vec();
    sizes.push_back(tc.size(1));
    auto out = torch::empty(sizes, tc.options());
    gather_launch(ic.data_ptr<float>(), tc.data_ptr<float>(), out.data_ptr<float>(),
                  ic.numel(), tc.size(1));
    return out;
}
"""

ext = load_inline(name="protocols_gather", cpp_sources=[cpp_src], cuda_sources=[cuda_src],
                  functions=["gather"], no_implicit_headers=True)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = nn.Embedding(512, 64)

    def forward(self, idx):
        return ext.gather(idx, self.table.weight)
'''

MULTINOMIAL_REF = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, weights):
        return torch.multinomial(weights, 4, replacement=True)


def get_inputs():
    return [torch.rand(32, 100) + 0.01]


def get_init_inputs():
    return []
'''


def test_device_side_asserts_of_the_reference_never_fail_a_candidate(tmp_path):
    relu_copy = RELU_REF.replace("class Model(", "class ModelNew(")
    jobs = [job("embedding", EMBEDDING_REF, EMBEDDING_KERNEL, "cuda"),
            job("multinomial", MULTINOMIAL_REF,
                MULTINOMIAL_REF.replace("class Model(", "class ModelNew("), "cuda"),
            job("after", RELU_REF, relu_copy, "cuda")]
    with HarnessSession(settings(tmp_path)) as session:
        rows = by_id(session.evaluate(jobs, progress=False))
        plans = session._batch.reference_plans
        assert plans.fatal >= 1, "the embedding should break a probe's context"
    for name in ("embedding", "multinomial", "after"):
        row = rows[name]
        assert row["error"] is None, (name, row["error"])
        assert "negated" not in row["variants_run"] or name == "after"
        for protocol in BUILTIN_PROTOCOLS:
            assert judge(row, protocol=named_protocol(protocol), robust=False) == "accepted", (
                name, protocol, row["kb_trial_tolerance"], row["tolerance_needed"])
    assert not rows["embedding"]["flag_no_kernel"]  # a kernel of its own, judged robustly too
    assert judge(rows["embedding"], protocol=named_protocol("kernelbench"), robust=True) == \
        "accepted"
