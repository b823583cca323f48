import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <cstdint>
#include <cstring>

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

// exp(x) to about 1 ulp without a libm call, so that loops calling it vectorise.
static inline float fast_exp(float x) {
    x = select_f(x < -87.0f, -87.0f, x);
    x = select_f(x > 88.0f, 88.0f, x);
    // n = round(x / ln2): adding 1.5 * 2^23 leaves n in the low mantissa bits.
    const float shifted = x * 1.44269504f + 12582912.0f;
    int32_t n_bits;
    std::memcpy(&n_bits, &shifted, 4);
    const float n = shifted - 12582912.0f;
    const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const int32_t scale_bits = (n_bits - 0x4B400000 + 127) << 23;
    float scale;
    std::memcpy(&scale, &scale_bits, 4);
    return p * scale;
}

static void check_float_cpu(const torch::Tensor& t, const char* what) {
    TORCH_CHECK(t.device().is_cpu(), what, " must be a CPU tensor");
    TORCH_CHECK(t.scalar_type() == torch::kFloat32, what, " must be float32, got ", t.scalar_type());
}

torch::Tensor sigmoid_forward(torch::Tensor x) {
    check_float_cpu(x, "sigmoid_forward: x");
    auto input = x.contiguous();
    auto out = torch::empty_like(input);
    const float* src = input.data_ptr<float>();
    float* dst = out.data_ptr<float>();
    const int64_t n = input.numel();
    // 1 / (1 + exp(-x)) with the polynomial exp: the loop vectorises (4-wide SSE at these flags).
#pragma omp parallel for schedule(static) if (n > 16384)
    for (int64_t i = 0; i < n; ++i) {
        dst[i] = 1.0f / (1.0f + fast_exp(-src[i]));
    }
    return out;
}
"""

sigmoid_ext = load_inline(
    name="seed_baseline_sigmoid",
    cpp_sources=[cpp_source],
    functions=["sigmoid_forward"],
    extra_cflags=["-O3", "-fopenmp"],
    extra_ldflags=["-fopenmp"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return sigmoid_ext.sigmoid_forward(x)
