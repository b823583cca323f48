import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <cmath>

static void check_float_cpu(const torch::Tensor& t, const char* what) {
    TORCH_CHECK(t.device().is_cpu(), what, " must be a CPU tensor");
    TORCH_CHECK(t.scalar_type() == torch::kFloat32, what, " must be float32, got ", t.scalar_type());
}

torch::Tensor rms_norm_forward(torch::Tensor x, torch::Tensor weight, double eps) {
    check_float_cpu(x, "rms_norm_forward: x");
    check_float_cpu(weight, "rms_norm_forward: weight");
    const int64_t cols = x.size(-1);
    TORCH_CHECK(cols > 0 && weight.numel() == cols, "rms_norm_forward: weight needs ", cols, " elements");
    auto input = x.contiguous();
    auto w = weight.contiguous();
    auto out = torch::empty_like(input);
    const float* src = input.data_ptr<float>();
    const float* wp = w.data_ptr<float>();
    float* dst = out.data_ptr<float>();
    const int64_t rows = input.numel() / cols;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        const float* xr = src + r * cols;
        float* yr = dst + r * cols;
        float lanes[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        int64_t j = 0;
        for (; j + 8 <= cols; j += 8) {
            for (int l = 0; l < 8; ++l) lanes[l] += xr[j + l] * xr[j + l];
        }
        float sum_sq = 0.0f;
        for (int l = 0; l < 8; ++l) sum_sq += lanes[l];
        for (; j < cols; ++j) sum_sq += xr[j] * xr[j];
        const float inv_rms = 1.0f / std::sqrt(sum_sq / cols + static_cast<float>(eps));
        for (j = 0; j < cols; ++j) yr[j] = xr[j] * inv_rms * wp[j];
    }
    return out;
}
"""

rms_norm_ext = load_inline(
    name="seed_rms_norm",
    cpp_sources=[cpp_source],
    functions=["rms_norm_forward"],
    extra_cflags=["-O3", "-fopenmp"],
    extra_ldflags=["-fopenmp"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return rms_norm_ext.rms_norm_forward(x, self.weight, self.eps)
