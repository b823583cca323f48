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

static void check_same_shape(const torch::Tensor& a, const torch::Tensor& b, const char* what) {
    TORCH_CHECK(a.sizes() == b.sizes(), what, ": shapes differ: ", a.sizes(), " vs ", b.sizes());
}

torch::Tensor add_layer_norm_forward(torch::Tensor x, torch::Tensor residual, torch::Tensor weight,
                                     torch::Tensor bias, double eps) {
    check_float_cpu(x, "add_layer_norm_forward: x");
    check_float_cpu(residual, "add_layer_norm_forward: residual");
    check_float_cpu(weight, "add_layer_norm_forward: weight");
    check_float_cpu(bias, "add_layer_norm_forward: bias");
    check_same_shape(x, residual, "add_layer_norm_forward");
    const int64_t cols = x.size(-1);
    TORCH_CHECK(cols > 0 && weight.numel() == cols && bias.numel() == cols,
                "add_layer_norm_forward: weight and bias need ", cols, " elements");
    auto xc = x.contiguous();
    auto rc = residual.contiguous();
    auto w = weight.contiguous();
    auto b = bias.contiguous();
    auto out = torch::empty_like(xc);
    const float* px = xc.data_ptr<float>();
    const float* pr = rc.data_ptr<float>();
    const float* pw = w.data_ptr<float>();
    const float* pb = b.data_ptr<float>();
    float* dst = out.data_ptr<float>();
    const int64_t rows = xc.numel() / cols;
    // The sum lives only in the output row (in cache), never as a separate tensor.
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        float* yr = dst + r * cols;
        const float* xr = px + r * cols;
        const float* rr = pr + r * cols;
        float lanes[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        int64_t j = 0;
        for (; j + 8 <= cols; j += 8) {
            for (int l = 0; l < 8; ++l) {
                yr[j + l] = xr[j + l] + rr[j + l];
                lanes[l] += yr[j + l];
            }
        }
        float sum = 0.0f;
        for (int l = 0; l < 8; ++l) sum += lanes[l];
        for (; j < cols; ++j) {
            yr[j] = xr[j] + rr[j];
            sum += yr[j];
        }
        const float mean = sum / cols;
        for (int l = 0; l < 8; ++l) lanes[l] = 0.0f;
        j = 0;
        for (; j + 8 <= cols; j += 8) {
            for (int l = 0; l < 8; ++l) lanes[l] += (yr[j + l] - mean) * (yr[j + l] - mean);
        }
        float sum_sq = 0.0f;
        for (int l = 0; l < 8; ++l) sum_sq += lanes[l];
        for (; j < cols; ++j) sum_sq += (yr[j] - mean) * (yr[j] - mean);
        const float rstd = 1.0f / std::sqrt(sum_sq / cols + static_cast<float>(eps));
        for (j = 0; j < cols; ++j) yr[j] = (yr[j] - mean) * rstd * pw[j] + pb[j];
    }
    return out;
}
"""

add_ln_ext = load_inline(
    name="seed_add_layernorm",
    cpp_sources=[cpp_source],
    functions=["add_layer_norm_forward"],
    extra_cflags=["-O3", "-fopenmp"],
    extra_ldflags=["-fopenmp"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim)

    def forward(self, x, residual):
        return add_ln_ext.add_layer_norm_forward(
            x, residual, self.norm.weight, self.norm.bias, self.norm.eps
        )
