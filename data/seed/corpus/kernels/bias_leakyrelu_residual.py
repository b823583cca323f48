import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <cstdint>
#include <cstring>

static void check_float_cpu(const torch::Tensor& t, const char* what) {
    TORCH_CHECK(t.device().is_cpu(), what, " must be a CPU tensor");
    TORCH_CHECK(t.scalar_type() == torch::kFloat32, what, " must be float32, got ", t.scalar_type());
}

static void check_same_shape(const torch::Tensor& a, const torch::Tensor& b, const char* what) {
    TORCH_CHECK(a.sizes() == b.sizes(), what, ": shapes differ: ", a.sizes(), " vs ", b.sizes());
}

// Branch-free select on the bits: under GCC's default -ftrapping-math a float compare in a
// ternary stays a branch, and a branch in the loop body stops vectorisation.
static inline float select_f(bool cond, float a, float b) {
    uint32_t ua, ub;
    std::memcpy(&ua, &a, 4);
    std::memcpy(&ub, &b, 4);
    const uint32_t mask = 0u - static_cast<uint32_t>(cond);
    const uint32_t bits = (ua & mask) | (ub & ~mask);
    float out;
    std::memcpy(&out, &bits, 4);
    return out;
}

torch::Tensor bias_leakyrelu_residual_forward(torch::Tensor x, torch::Tensor residual, torch::Tensor bias,
                                              double negative_slope, double scale) {
    check_float_cpu(x, "bias_leakyrelu_residual_forward: x");
    check_float_cpu(residual, "bias_leakyrelu_residual_forward: residual");
    check_float_cpu(bias, "bias_leakyrelu_residual_forward: bias");
    check_same_shape(x, residual, "bias_leakyrelu_residual_forward");
    const int64_t cols = x.size(-1);
    TORCH_CHECK(cols > 0 && bias.numel() == cols, "bias_leakyrelu_residual_forward: bias needs ", cols, " elements");
    auto xc = x.contiguous();
    auto rc = residual.contiguous();
    auto bc = bias.contiguous();
    auto out = torch::empty_like(xc);
    const float* px = xc.data_ptr<float>();
    const float* pr = rc.data_ptr<float>();
    const float* pb = bc.data_ptr<float>();
    float* dst = out.data_ptr<float>();
    const float slope = static_cast<float>(negative_slope), s = static_cast<float>(scale);
    const int64_t rows = xc.numel() / cols;
    // Four eager ops, three temporaries and four passes over memory become one pass.
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t base = r * cols;
        for (int64_t j = 0; j < cols; ++j) {
            const float v = px[base + j] + pb[j];
            dst[base + j] = select_f(v > 0.0f, v, v * slope) * s + pr[base + j];
        }
    }
    return out;
}
"""

bias_act_ext = load_inline(
    name="seed_bias_leakyrelu_residual",
    cpp_sources=[cpp_source],
    functions=["bias_leakyrelu_residual_forward"],
    extra_cflags=["-O3", "-fopenmp"],
    extra_ldflags=["-fopenmp"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, dim, negative_slope, scale):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(dim) * 0.1)
        self.negative_slope = negative_slope
        self.scale = scale

    def forward(self, x, residual):
        return bias_act_ext.bias_leakyrelu_residual_forward(
            x, residual, self.bias, self.negative_slope, self.scale
        )
