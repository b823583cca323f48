import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

chain_source = r"""
#include <torch/extension.h>

torch::Tensor chain_cpu(torch::Tensor input) {
    input = input.contiguous();
    auto out = torch::empty_like(input);
    const float* px = input.data_ptr<float>();
    float* po = out.data_ptr<float>();
    int64_t n = input.numel();
    #pragma omp parallel for
    for (int64_t i = 0; i < n; ++i) {
        float x = px[i];
        // x1 = torch.abs(x)
        float x1 = std::abs(x);
        // x2 = x1 * 0.5 - 0.5
        float x2 = x1 * 0.5f - 0.5f;
        // x3 = x2 * -2.0
        float x3 = x2 * -2.0f;
        // x4 = x3 * -2.0 - 2.0
        float x4 = x3 * -2.0f - 2.0f;
        po[i] = x4;
    }
    return out;
}
"""

chain_ext = load_inline(name="chain_ext", cpp_sources=chain_source, functions=["chain_cpu"],
                        extra_cflags=["-O3", "-fno-trapping-math", "-fopenmp"],
                        extra_ldflags=["-fopenmp"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return chain_ext.chain_cpu(x)
