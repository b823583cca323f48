import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <vector>
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

// Dot product with eight partial sums, so that GCC vectorises it without -ffast-math.
static inline float dot8(const float* a, const float* b, int64_t n) {
    float lanes[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    int64_t p = 0;
    for (; p + 8 <= n; p += 8) {
        for (int l = 0; l < 8; ++l) lanes[l] += a[p + l] * b[p + l];
    }
    float total = 0.0f;
    for (int l = 0; l < 8; ++l) total += lanes[l];
    for (; p < n; ++p) total += a[p] * b[p];
    return total;
}

static inline float sigmoid_f(float v) { return 1.0f / (1.0f + fast_exp(-v)); }
static inline float tanh_f(float v) { return 2.0f / (1.0f + fast_exp(-2.0f * v)) - 1.0f; }

torch::Tensor lstm_cell_forward(torch::Tensor x, torch::Tensor h, torch::Tensor c, torch::Tensor w_ih,
                                torch::Tensor b_ih, torch::Tensor w_hh, torch::Tensor b_hh) {
    for (const auto* t : {&x, &h, &c, &w_ih, &b_ih, &w_hh, &b_hh}) check_float_cpu(*t, "lstm_cell_forward: inputs");
    TORCH_CHECK(x.dim() == 2 && h.dim() == 2 && c.sizes() == h.sizes() && h.size(0) == x.size(0),
                "lstm_cell_forward: x must be [batch, input], h and c [batch, hidden]");
    const int64_t batch = x.size(0), in = x.size(1), hidden = h.size(1);
    TORCH_CHECK(w_ih.dim() == 2 && w_ih.size(0) == 4 * hidden && w_ih.size(1) == in && b_ih.numel() == 4 * hidden,
                "lstm_cell_forward: input map must be [4 hidden, input] with a [4 hidden] bias");
    TORCH_CHECK(w_hh.dim() == 2 && w_hh.size(0) == 4 * hidden && w_hh.size(1) == hidden && b_hh.numel() == 4 * hidden,
                "lstm_cell_forward: hidden map must be [4 hidden, hidden] with a [4 hidden] bias");
    auto xc = x.contiguous(), hc = h.contiguous(), cc = c.contiguous();
    auto wi = w_ih.contiguous(), bi = b_ih.contiguous(), wh = w_hh.contiguous(), bh = b_hh.contiguous();
    auto out = torch::empty({batch, hidden}, xc.options());
    const float *px = xc.data_ptr<float>(), *ph = hc.data_ptr<float>(), *pc = cc.data_ptr<float>();
    const float *pwi = wi.data_ptr<float>(), *pbi = bi.data_ptr<float>();
    const float *pwh = wh.data_ptr<float>(), *pbh = bh.data_ptr<float>();
    float* dst = out.data_ptr<float>();
    // Per row: both gate products, then the gate nonlinearities and the state update, with the
    // gates held in a row-sized buffer instead of six [batch, 4 hidden] temporaries.
#pragma omp parallel if (batch * hidden * (in + hidden) > (1 << 20))
    {
        std::vector<float> gates(4 * hidden);
#pragma omp for schedule(static)
        for (int64_t r = 0; r < batch; ++r) {
            for (int64_t j = 0; j < 4 * hidden; ++j) {
                gates[j] = (dot8(px + r * in, pwi + j * in, in) + pbi[j]) +
                           (dot8(ph + r * hidden, pwh + j * hidden, hidden) + pbh[j]);
            }
            for (int64_t u = 0; u < hidden; ++u) {
                const float c_next = sigmoid_f(gates[hidden + u]) * pc[r * hidden + u] +
                                     sigmoid_f(gates[u]) * tanh_f(gates[2 * hidden + u]);
                dst[r * hidden + u] = sigmoid_f(gates[3 * hidden + u]) * tanh_f(c_next);
            }
        }
    }
    return out;
}
"""

lstm_ext = load_inline(
    name="seed_lstm_cell",
    cpp_sources=[cpp_source],
    functions=["lstm_cell_forward"],
    extra_cflags=["-O3", "-fopenmp"],
    extra_ldflags=["-fopenmp"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, input_size, hidden_size):
        super().__init__()
        self.input_map = nn.Linear(input_size, 4 * hidden_size)
        self.hidden_map = nn.Linear(hidden_size, 4 * hidden_size)

    def forward(self, x, h, c):
        return lstm_ext.lstm_cell_forward(
            x,
            h,
            c,
            self.input_map.weight,
            self.input_map.bias,
            self.hidden_map.weight,
            self.hidden_map.bias,
        )
