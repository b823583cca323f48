import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

chain_source = r"""
#include <torch/extension.h>

__global__ void chain_kernel(const float* px, float* po, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) {
        float v = px[i];
        // x = x * 0.75
        v = v * 0.75f;
        // x = torch.clamp(x, 0.0, 3.0)
        v = std::min(std::max(v, 0.0f), 3.0f);
        // x = x * 0.25 - 0.1
        v = v * 0.25f - 0.1f;
        // x = torch.relu(x)
        v = std::max(v, 0.0f);
        po[i] = v;
    }
}

torch::Tensor chain_cuda(torch::Tensor x) {
    x = x.contiguous();
    auto out = torch::empty_like(x);
    int64_t n = x.numel();
    int threads = 256;
    chain_kernel<<<(n + threads - 1) / threads, threads>>>(
        x.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}
"""

chain_decl = "torch::Tensor chain_cuda(torch::Tensor x);"

chain_ext = load_inline(name="chain_ext", cpp_sources=chain_decl, cuda_sources=chain_source,
                        functions=["chain_cuda"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return chain_ext.chain_cuda(x)
