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

// Eight partial sums: GCC vectorises this without -ffast-math, and it rounds less than a
// single running sum.
static inline float sum8(const float* x, int64_t n) {
    float lanes[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        for (int l = 0; l < 8; ++l) lanes[l] += x[j + l];
    }
    float total = 0.0f;
    for (int l = 0; l < 8; ++l) total += lanes[l];
    for (; j < n; ++j) total += x[j];
    return total;
}

static inline float sum_sq_dev8(const float* x, float mean, int64_t n) {
    float lanes[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        for (int l = 0; l < 8; ++l) lanes[l] += (x[j + l] - mean) * (x[j + l] - mean);
    }
    float total = 0.0f;
    for (int l = 0; l < 8; ++l) total += lanes[l];
    for (; j < n; ++j) total += (x[j] - mean) * (x[j] - mean);
    return total;
}

torch::Tensor layer_norm_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, double eps) {
    check_float_cpu(x, "layer_norm_forward: x");
    check_float_cpu(weight, "layer_norm_forward: weight");
    check_float_cpu(bias, "layer_norm_forward: bias");
    const int64_t cols = x.size(-1);
    TORCH_CHECK(cols > 0 && weight.numel() == cols && bias.numel() == cols,
                "layer_norm_forward: weight and bias need ", cols, " elements");
    auto input = x.contiguous();
    auto w = weight.contiguous();
    auto b = bias.contiguous();
    auto out = torch::empty_like(input);
    const float* src = input.data_ptr<float>();
    const float* wp = w.data_ptr<float>();
    const float* bp = b.data_ptr<float>();
    float* dst = out.data_ptr<float>();
    const int64_t rows = input.numel() / cols;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        const float* xr = src + r * cols;
        float* yr = dst + r * cols;
        const float mean = sum8(xr, cols) / cols;
        // Two passes (mean, then squared deviations) avoid the cancellation of E[x^2] - E[x]^2.
        const float rstd = 1.0f / std::sqrt(sum_sq_dev8(xr, mean, cols) / cols + static_cast<float>(eps));
        for (int64_t j = 0; j < cols; ++j) yr[j] = (xr[j] - mean) * rstd * wp[j] + bp[j];
    }
    return out;
}
"""

layer_norm_ext = load_inline(
    name="seed_layer_norm",
    cpp_sources=[cpp_source],
    functions=["layer_norm_forward"],
    extra_cflags=["-O3", "-fopenmp"],
    extra_ldflags=["-fopenmp"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        return layer_norm_ext.layer_norm_forward(x, self.norm.weight, self.norm.bias, self.norm.eps)
