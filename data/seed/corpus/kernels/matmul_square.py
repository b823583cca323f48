import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>

static void check_float_cpu(const torch::Tensor& t, const char* what) {
    TORCH_CHECK(t.device().is_cpu(), what, " must be a CPU tensor");
    TORCH_CHECK(t.scalar_type() == torch::kFloat32, what, " must be float32, got ", t.scalar_type());
}

torch::Tensor matmul_forward(torch::Tensor a, torch::Tensor b) {
    check_float_cpu(a, "matmul_forward: a");
    check_float_cpu(b, "matmul_forward: b");
    TORCH_CHECK(a.dim() == 2 && b.dim() == 2, "matmul_forward: a and b must be 2-d");
    TORCH_CHECK(a.size(1) == b.size(0), "matmul_forward: inner sizes differ: ", a.size(1), " vs ", b.size(0));
    auto lhs = a.contiguous();
    auto rhs = b.contiguous();
    const int64_t m = lhs.size(0), k = lhs.size(1), n = rhs.size(1);
    auto out = torch::zeros({m, n}, lhs.options());
    const float* pa = lhs.data_ptr<float>();
    const float* pb = rhs.data_ptr<float>();
    float* pc = out.data_ptr<float>();
    // i-k-j order: the innermost loop walks a row of B and a row of C, so it vectorises.
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < m; ++i) {
        float* c_row = pc + i * n;
        for (int64_t p = 0; p < k; ++p) {
            const float a_ip = pa[i * k + p];
            const float* b_row = pb + p * n;
            for (int64_t j = 0; j < n; ++j) c_row[j] += a_ip * b_row[j];
        }
    }
    return out;
}
"""

matmul_ext = load_inline(
    name="seed_matmul_square",
    cpp_sources=[cpp_source],
    functions=["matmul_forward"],
    extra_cflags=["-O3", "-fopenmp"],
    extra_ldflags=["-fopenmp"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return matmul_ext.matmul_forward(a, b)
