import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <algorithm>
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

// An OpenMP simd max-reduction vectorises; a plain float max loop does not without -ffast-math.
static inline float row_max(const float* x, int64_t n) {
    float m = x[0];
#pragma omp simd reduction(max : m)
    for (int64_t j = 1; j < n; ++j) m = std::max(m, x[j]);
    return m;
}

torch::Tensor causal_softmax_forward(torch::Tensor scores, double scale) {
    check_float_cpu(scores, "causal_softmax_forward: scores");
    TORCH_CHECK(scores.dim() >= 2 && scores.size(-1) == scores.size(-2) && scores.size(-1) > 0,
                "causal_softmax_forward: scores must end in a non-empty square [seq, seq]");
    auto input = scores.contiguous();
    auto out = torch::empty_like(input);
    const float* src = input.data_ptr<float>();
    float* dst = out.data_ptr<float>();
    const int64_t seq = input.size(-1);
    const int64_t rows = input.numel() / seq;
    const float s = static_cast<float>(scale);
    // Query q sees keys 0..q: the masked tail is written as zeros and never exponentiated.
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        const float* xr = src + r * seq;
        float* yr = dst + r * seq;
        const int64_t visible = r % seq + 1;
        // max(x) * s is the max of x * s only for s >= 0, so scale first.
        for (int64_t j = 0; j < visible; ++j) yr[j] = xr[j] * s;
        const float peak = row_max(yr, visible);
        for (int64_t j = 0; j < visible; ++j) yr[j] = fast_exp(yr[j] - peak);
        float total = 0.0f;
#pragma omp simd reduction(+ : total)
        for (int64_t j = 0; j < visible; ++j) total += yr[j];
        const float inv_total = 1.0f / total;
        for (int64_t j = 0; j < visible; ++j) yr[j] *= inv_total;
        for (int64_t j = visible; j < seq; ++j) yr[j] = 0.0f;
    }
    return out;
}
"""

causal_softmax_ext = load_inline(
    name="seed_causal_scaled_softmax",
    cpp_sources=[cpp_source],
    functions=["causal_softmax_forward"],
    extra_cflags=["-O3", "-fopenmp"],
    extra_ldflags=["-fopenmp"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, seq_len, scale):
        super().__init__()
        self.scale = scale
        mask = torch.triu(torch.ones(seq_len, seq_len, dtype=torch.bool), diagonal=1)
        self.register_buffer("causal_mask", mask)

    def forward(self, scores):
        return causal_softmax_ext.causal_softmax_forward(scores, self.scale)
