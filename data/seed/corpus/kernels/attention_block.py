import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <algorithm>
#include <cmath>
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

// An OpenMP simd max-reduction vectorises; a plain float max loop does not without -ffast-math.
static inline float row_max(const float* x, int64_t n) {
    float m = x[0];
#pragma omp simd reduction(max : m)
    for (int64_t j = 1; j < n; ++j) m = std::max(m, x[j]);
    return m;
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

// y[m, n] = epilogue(i, j, x[m, k] . w[n, k] + b[n]) (nn.Linear layout). Threads split the
// output features in blocks of 32 rows of w, which stay in cache while every row of x passes.
template <typename Epilogue>
static void linear_rows(const float* x, const float* w, const float* b, float* y,
                        int64_t m, int64_t k, int64_t n, Epilogue epilogue) {
#pragma omp parallel for schedule(static)
    for (int64_t jb = 0; jb < n; jb += 32) {
        const int64_t je = std::min(jb + 32, n);
        for (int64_t i = 0; i < m; ++i) {
            for (int64_t j = jb; j < je; ++j) {
                y[i * n + j] = epilogue(i, j, dot8(x + i * k, w + j * k, k) + b[j]);
            }
        }
    }
}

static void check_linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b, const char* what) {
    TORCH_CHECK(w.dim() == 2 && x.size(-1) == w.size(1), what, ": x has ", x.size(-1),
                " features, weight expects ", w.size(1));
    TORCH_CHECK(b.numel() == w.size(0), what, ": bias needs ", w.size(0), " elements");
}

// One query row of one head: scores, softmax and the weighted sum of values in one pass over
// the keys, so the [seq, seq] score matrix is never materialised.
static void attend_row(const float* qkv, float* out, int64_t seq, int64_t embed, int64_t head_dim,
                       int64_t batch_idx, int64_t head, int64_t query, float scale,
                       std::vector<float>& probs, std::vector<float>& acc) {
    const int64_t stride = 3 * embed;
    const float* base = qkv + batch_idx * seq * stride + head * head_dim;
    const float* q = base + query * stride;
    for (int64_t j = 0; j < seq; ++j) probs[j] = dot8(q, base + j * stride + embed, head_dim) * scale;
    const float peak = row_max(probs.data(), seq);
    for (int64_t j = 0; j < seq; ++j) probs[j] = fast_exp(probs[j] - peak);
    float total = 0.0f;
#pragma omp simd reduction(+ : total)
    for (int64_t j = 0; j < seq; ++j) total += probs[j];
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t j = 0; j < seq; ++j) {
        const float* v = base + j * stride + 2 * embed;
        const float p = probs[j];
        for (int64_t d = 0; d < head_dim; ++d) acc[d] += p * v[d];
    }
    float* dst = out + (batch_idx * seq + query) * embed + head * head_dim;
    for (int64_t d = 0; d < head_dim; ++d) dst[d] = acc[d] / total;
}

torch::Tensor attention_block_forward(torch::Tensor x, torch::Tensor w_qkv, torch::Tensor b_qkv,
                                      torch::Tensor w_proj, torch::Tensor b_proj, int64_t num_heads) {
    for (const auto* t : {&x, &w_qkv, &b_qkv, &w_proj, &b_proj}) check_float_cpu(*t, "attention_block_forward: inputs");
    TORCH_CHECK(x.dim() == 3, "attention_block_forward: x must be [batch, seq, embed]");
    const int64_t batch = x.size(0), seq = x.size(1), embed = x.size(2);
    TORCH_CHECK(num_heads > 0 && embed % num_heads == 0, "attention_block_forward: embed ", embed,
                " is not divisible by num_heads ", num_heads);
    check_linear(x, w_qkv, b_qkv, "attention_block_forward: qkv");
    check_linear(x, w_proj, b_proj, "attention_block_forward: proj");
    TORCH_CHECK(w_qkv.size(0) == 3 * embed && w_proj.size(0) == embed,
                "attention_block_forward: qkv weight must be [3 embed, embed], proj weight [embed, embed]");
    auto input = x.contiguous();
    auto wq = w_qkv.contiguous(), bq = b_qkv.contiguous(), wp = w_proj.contiguous(), bp = b_proj.contiguous();
    const int64_t tokens = batch * seq, head_dim = embed / num_heads;
    const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    auto identity = [](int64_t, int64_t, float v) { return v; };
    auto qkv = torch::empty({tokens, 3 * embed}, input.options());
    linear_rows(input.data_ptr<float>(), wq.data_ptr<float>(), bq.data_ptr<float>(), qkv.data_ptr<float>(),
                tokens, embed, 3 * embed, identity);
    auto mixed = torch::empty({tokens, embed}, input.options());
    const float* pqkv = qkv.data_ptr<float>();
    float* pmixed = mixed.data_ptr<float>();
#pragma omp parallel
    {
        std::vector<float> probs(seq), acc(head_dim);
#pragma omp for schedule(static)
        for (int64_t idx = 0; idx < batch * num_heads * seq; ++idx) {
            const int64_t b = idx / (num_heads * seq), h = (idx / seq) % num_heads, i = idx % seq;
            attend_row(pqkv, pmixed, seq, embed, head_dim, b, h, i, scale, probs, acc);
        }
    }
    auto out = torch::empty({batch, seq, embed}, input.options());
    linear_rows(pmixed, wp.data_ptr<float>(), bp.data_ptr<float>(), out.data_ptr<float>(), tokens, embed, embed, identity);
    return out;
}
"""

attention_ext = load_inline(
    name="seed_attention_block",
    cpp_sources=[cpp_source],
    functions=["attention_block_forward"],
    extra_cflags=["-O3", "-fopenmp"],
    extra_ldflags=["-fopenmp"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim)
        self.proj = nn.Linear(embed_dim, embed_dim)

    def forward(self, x):
        return attention_ext.attention_block_forward(
            x, self.qkv.weight, self.qkv.bias, self.proj.weight, self.proj.bias, self.num_heads
        )
