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

static void check_float_cpu(const torch::Tensor& t, const char* what) {
    TORCH_CHECK(t.device().is_cpu(), what, " must be a CPU tensor");
    TORCH_CHECK(t.scalar_type() == torch::kFloat32, what, " must be float32, got ", t.scalar_type());
}

torch::Tensor hardswish_residual_clamp_forward(torch::Tensor x, torch::Tensor residual) {
    check_float_cpu(x, "hardswish_residual_clamp_forward: x");
    check_float_cpu(residual, "hardswish_residual_clamp_forward: residual");
    TORCH_CHECK(x.sizes() == residual.sizes(),
                "hardswish_residual_clamp_forward: x and residual must have the same shape");
    auto input = x.contiguous();
    auto res = residual.contiguous();
    auto out = torch::empty_like(input);
    const float* __restrict src = input.data_ptr<float>();
    const float* __restrict add = res.data_ptr<float>();
    float* __restrict dst = out.data_ptr<float>();
    const int64_t n = input.numel();
    // hardswish(x) = x * clamp(x + 3, 0, 6) / 6; three eager ops and two temporaries become
    // one pass over memory. The output is a fresh tensor (no aliasing): the loop vectorises.
#pragma omp parallel for simd schedule(static) if (n > 16384)
    for (int64_t i = 0; i < n; ++i) {
        const float v = src[i];
        float gate = v + 3.0f;
        gate = select_f(gate < 0.0f, 0.0f, gate);
        gate = select_f(gate > 6.0f, 6.0f, gate);
        float y = v * gate * (1.0f / 6.0f) + add[i];  // a multiply, not a divide
        y = select_f(y < -1.0f, -1.0f, y);
        y = select_f(y > 1.0f, 1.0f, y);
        dst[i] = y;
    }
    return out;
}
"""

hardswish_ext = load_inline(
    name="seed_baseline_hardswish_residual_clamp",
    cpp_sources=[cpp_source],
    functions=["hardswish_residual_clamp_forward"],
    extra_cflags=["-O3", "-fopenmp"],
    extra_ldflags=["-fopenmp"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, residual):
        return hardswish_ext.hardswish_residual_clamp_forward(x, residual)
