import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <cmath>
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

static void check_same_shape(const torch::Tensor& a, const torch::Tensor& b, const char* what) {
    TORCH_CHECK(a.sizes() == b.sizes(), what, ": shapes differ: ", a.sizes(), " vs ", b.sizes());
}

// Exact GELU, 0.5 x (1 + erf(x / sqrt 2)), with erf from Abramowitz & Stegun 7.1.26
// (absolute error below 1.5e-7) so the loop stays free of libm calls.
static inline float gelu_erf(float x) {
    const float z = std::fabs(x) * 0.70710678f;
    const float t = 1.0f / (1.0f + 0.3275911f * z);
    const float poly = t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f +
                       t * (-1.453152027f + t * 1.061405429f))));
    const float erf_abs = 1.0f - poly * fast_exp(-z * z);
    return 0.5f * x * (1.0f + std::copysign(erf_abs, x));
}

torch::Tensor scale_residual_gelu_forward(torch::Tensor x, torch::Tensor residual, double scale) {
    check_float_cpu(x, "scale_residual_gelu_forward: x");
    check_float_cpu(residual, "scale_residual_gelu_forward: residual");
    check_same_shape(x, residual, "scale_residual_gelu_forward");
    auto xc = x.contiguous();
    auto rc = residual.contiguous();
    auto out = torch::empty_like(xc);
    const float* px = xc.data_ptr<float>();
    const float* pr = rc.data_ptr<float>();
    float* dst = out.data_ptr<float>();
    const float s = static_cast<float>(scale);
    const int64_t n = xc.numel();
    // One pass instead of three: no temporaries for x * scale and for the sum.
#pragma omp parallel for schedule(static) if (n > 16384)
    for (int64_t i = 0; i < n; ++i) dst[i] = gelu_erf(px[i] * s + pr[i]);
    return out;
}
"""

fused_ext = load_inline(
    name="seed_scale_residual_gelu",
    cpp_sources=[cpp_source],
    functions=["scale_residual_gelu_forward"],
    extra_cflags=["-O3", "-fopenmp"],
    extra_ldflags=["-fopenmp"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x, residual):
        return fused_ext.scale_residual_gelu_forward(x, residual, self.scale)
