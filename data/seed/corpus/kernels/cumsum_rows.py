import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <algorithm>
#include <vector>

static void check_float_cpu(const torch::Tensor& t, const char* what) {
    TORCH_CHECK(t.device().is_cpu(), what, " must be a CPU tensor");
    TORCH_CHECK(t.scalar_type() == torch::kFloat32, what, " must be float32, got ", t.scalar_type());
}

// Views x as [outer, length, inner] around `dim`.
static void split_at_dim(const torch::Tensor& x, int64_t dim, int64_t& outer, int64_t& length, int64_t& inner) {
    outer = 1;
    inner = 1;
    for (int64_t d = 0; d < dim; ++d) outer *= x.size(d);
    for (int64_t d = dim + 1; d < x.dim(); ++d) inner *= x.size(d);
    length = x.size(dim);
}

static int64_t wrap_dim(int64_t dim, int64_t ndim, const char* what) {
    if (dim < 0) dim += ndim;
    TORCH_CHECK(dim >= 0 && dim < ndim, what, ": dim out of range for a ", ndim, "-d tensor");
    return dim;
}

torch::Tensor cumsum_forward(torch::Tensor x, int64_t dim) {
    check_float_cpu(x, "cumsum_forward: x");
    dim = wrap_dim(dim, x.dim(), "cumsum_forward");
    auto input = x.contiguous();
    auto out = torch::empty_like(input);
    int64_t outer, length, inner;
    split_at_dim(input, dim, outer, length, inner);
    const float* src = input.data_ptr<float>();
    float* dst = out.data_ptr<float>();
    // Double accumulators: a long float prefix sum drifts past 1e-4 of PyTorch's result.
    if (inner == 1) {
        // Scanning along contiguous rows: eight rows at a time give eight independent add
        // chains instead of one chain bound by the latency of a double add.
        const int64_t blocks = (outer + 7) / 8;
#pragma omp parallel for schedule(static)
        for (int64_t blk = 0; blk < blocks; ++blk) {
            const int64_t first = blk * 8, count = std::min<int64_t>(8, outer - first);
            double acc[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
            for (int64_t r = 0; r < length; ++r) {
                for (int64_t l = 0; l < count; ++l) {
                    acc[l] += src[(first + l) * length + r];
                    dst[(first + l) * length + r] = static_cast<float>(acc[l]);
                }
            }
        }
        return out;
    }
#pragma omp parallel for schedule(static)
    for (int64_t o = 0; o < outer; ++o) {
        std::vector<double> acc(inner, 0.0);
        const float* block = src + o * length * inner;
        float* out_block = dst + o * length * inner;
        for (int64_t r = 0; r < length; ++r) {
            for (int64_t i = 0; i < inner; ++i) {
                acc[i] += block[r * inner + i];
                out_block[r * inner + i] = static_cast<float>(acc[i]);
            }
        }
    }
    return out;
}
"""

cumsum_ext = load_inline(
    name="seed_cumsum_rows",
    cpp_sources=[cpp_source],
    functions=["cumsum_forward"],
    extra_cflags=["-O3", "-fopenmp"],
    extra_ldflags=["-fopenmp"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return cumsum_ext.cumsum_forward(x, self.dim)
