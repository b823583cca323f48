import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <cstdint>
#include <cstring>
#include <vector>

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

static int64_t wrap_dim(int64_t dim, int64_t ndim, const char* what) {
    if (dim < 0) dim += ndim;
    TORCH_CHECK(dim >= 0 && dim < ndim, what, ": dim out of range for a ", ndim, "-d tensor");
    return dim;
}

torch::Tensor max_dim_forward(torch::Tensor x, int64_t dim) {
    check_float_cpu(x, "max_dim_forward: x");
    dim = wrap_dim(dim, x.dim(), "max_dim_forward");
    auto input = x.contiguous();
    // Viewed as [outer, length, inner] around `dim`.
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < dim; ++d) outer *= input.size(d);
    for (int64_t d = dim + 1; d < input.dim(); ++d) inner *= input.size(d);
    const int64_t length = input.size(dim);
    TORCH_CHECK(length > 0, "max_dim_forward: cannot reduce an empty dimension");
    std::vector<int64_t> out_sizes;
    for (int64_t d = 0; d < input.dim(); ++d) {
        if (d != dim) out_sizes.push_back(input.size(d));
    }
    auto out = torch::empty(out_sizes, input.options());
    const float* src = input.data_ptr<float>();
    float* dst = out.data_ptr<float>();
    // Values only: eager torch.max(dim) also tracks the index of every maximum. Whole rows of
    // the reduced dimension are compared at once, so the inner loop is contiguous; a NaN
    // propagates as in torch.max.
#pragma omp parallel for schedule(static)
    for (int64_t o = 0; o < outer; ++o) {
        float* acc = dst + o * inner;
        const float* block = src + o * length * inner;
        for (int64_t i = 0; i < inner; ++i) acc[i] = block[i];
        for (int64_t r = 1; r < length; ++r) {
            const float* row = block + r * inner;
            for (int64_t i = 0; i < inner; ++i) {
                const float v = row[i], m = acc[i];
                acc[i] = select_f(v > m || v != v, v, m);
            }
        }
    }
    return out;
}
"""

max_ext = load_inline(
    name="seed_baseline_max_reduction",
    cpp_sources=[cpp_source],
    functions=["max_dim_forward"],
    extra_cflags=["-O3", "-fopenmp"],
    extra_ldflags=["-fopenmp"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return max_ext.max_dim_forward(x, self.dim)
