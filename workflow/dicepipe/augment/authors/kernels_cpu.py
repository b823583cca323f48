"""C++/OpenMP operator sources of the `templates` author for the cpu backend.

Every source reads its sizes from the tensors it is given, so one source serves every shape
of its families and the harness builds it once per machine. The dense projections stay on
ATen's GEMM (the same BLAS the reference calls); the gains come from what lies between
them: attention read in place from the projection layout (no transposes, no repeated kv
heads, no materialised mask or score tensor), activations and biases fused into one pass
over the GEMM output, and RMSNorm computed in one pass per row, all in one extension call
per forward instead of a dozen dispatched operators.

Runtime arguments (rows per task, thread count, GEMM fusion) are the variants that an
attempt index selects; they do not change the source."""

# Vectorisable float math: libm's expf/erff/tanhf are scalar calls that stop GCC from
# vectorising a loop, while ATen's own elementwise kernels are SIMD. These are branch-free
# polynomials (errors of 1e-7 to 2e-6, far inside the harness's tolerances), so loops built
# from them vectorise under `#pragma omp simd` (with -fno-trapping-math, which lets GCC
# if-convert the clamp; it changes no IEEE result).
_FAST_MATH = r"""
// e^x = 2^n * e^r with n = round(x / ln 2) and |r| <= ln(2) / 2; degree-6 Taylor for e^r.
static inline float fast_exp(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);
  // adding 1.5 * 2^23 rounds to the nearest integer, which then sits in the low mantissa bits
  const float shifted = x * 1.4426950408889634f + 12582912.0f;
  const float n = shifted - 12582912.0f;
  const int n_int = __builtin_bit_cast(int, shifted) - 0x4B400000;
  const float r = x - n * 0.693145751953125f - n * 1.428606765330187e-06f;
  const float p = 1.f + r * (1.f + r * (0.5f + r * (1.6666667e-1f + r * (4.1666668e-2f +
                  r * (8.3333338e-3f + r * 1.3888889e-3f)))));
  return p * __builtin_bit_cast(float, (n_int + 127) << 23);
}

// erf(x) = 1 - (1 + a1 x + ... + a6 x^6)^-16 for x >= 0 (Abramowitz-Stegun 7.1.28; in float
// arithmetic the absolute error stays below 2e-6).
static inline float fast_erf(float x) {
  const float a = std::fabs(x);
  float p = 1.f + a * (0.0705230784f + a * (0.0422820123f + a * (0.0092705272f +
            a * (0.0001520143f + a * (0.0002765672f + a * 0.0000430638f)))));
  p = p * p;
  p = p * p;
  p = p * p;
  p = p * p;
  const float e = 1.f - 1.f / p;
  return x < 0.f ? -e : e;
}

static inline float fast_tanh(float x) { return 1.f - 2.f / (fast_exp(2.f * x) + 1.f); }
"""

ATTENTION = r'''
#include <torch/extension.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>
@FAST_MATH@
namespace {

// Token rows as the projections write them: [batch * seq, width]; a head is a slice of a row.
struct Layout {
  int64_t batch, seq, heads, kv_heads, head_dim;
  int64_t q_stride, kv_stride;  // floats from one token's row to the next
};

inline float dot(const float* a, const float* b, int64_t n) {
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t d = 0; d < n; ++d) sum += a[d] * b[d];
  return sum;
}

// Query rows [row_begin, row_end) of one (batch, head): scores, exact softmax, weighted sum.
void attend_rows(const float* q, const float* k, const float* v, float* out, const Layout& s,
                 int64_t b, int64_t h, int64_t row_begin, int64_t row_end, bool causal,
                 float* scores) {
  const int64_t kv_head = h / (s.heads / s.kv_heads);
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  const float* k_head = k + b * s.seq * s.kv_stride + kv_head * s.head_dim;
  const float* v_head = v + b * s.seq * s.kv_stride + kv_head * s.head_dim;
  const int64_t out_stride = s.heads * s.head_dim;
  for (int64_t i = row_begin; i < row_end; ++i) {
    const float* qi = q + (b * s.seq + i) * s.q_stride + h * s.head_dim;
    float* oi = out + (b * s.seq + i) * out_stride + h * s.head_dim;
    const int64_t keys = causal ? i + 1 : s.seq;  // causal: the future is skipped, not masked
    float row_max = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < keys; ++j) {
      scores[j] = dot(qi, k_head + j * s.kv_stride, s.head_dim) * scale;
      row_max = std::max(row_max, scores[j]);
    }
    float total = 0.f;
#pragma omp simd reduction(+ : total)
    for (int64_t j = 0; j < keys; ++j) {
      scores[j] = fast_exp(scores[j] - row_max);
      total += scores[j];
    }
    const float inv_total = 1.0f / total;
    std::fill(oi, oi + s.head_dim, 0.f);
    for (int64_t j = 0; j < keys; ++j) {
      const float p = scores[j] * inv_total;
      const float* vj = v_head + j * s.kv_stride;
#pragma omp simd
      for (int64_t d = 0; d < s.head_dim; ++d) oi[d] += p * vj[d];
    }
  }
}

void attend(const float* q, const float* k, const float* v, float* out, const Layout& s,
            bool causal, int64_t rows_per_task, int threads) {
  const int64_t row_blocks = (s.seq + rows_per_task - 1) / rows_per_task;
  const int64_t tasks = s.batch * s.heads * row_blocks;
#pragma omp parallel num_threads(threads)
  {
    std::vector<float> scores(s.seq);
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < tasks; ++t) {
      const int64_t b = t / (s.heads * row_blocks);
      const int64_t h = (t / row_blocks) % s.heads;
      const int64_t begin = (t % row_blocks) * rows_per_task;
      attend_rows(q, k, v, out, s, b, h, begin, std::min(s.seq, begin + rows_per_task), causal,
                  scores.data());
    }
  }
}

}  // namespace

// Whole attention block: q/k/v projections, attention, output projection.
torch::Tensor attention_block(torch::Tensor x, torch::Tensor wq, torch::Tensor wk,
                              torch::Tensor wv, torch::Tensor wo, int64_t heads,
                              int64_t kv_heads, bool causal, int64_t rows_per_task,
                              int64_t threads, bool fuse_qkv) {
  TORCH_CHECK(x.dim() == 3 && x.scalar_type() == torch::kFloat, "x must be float32 [b, s, h]");
  TORCH_CHECK(heads > 0 && kv_heads > 0 && heads % kv_heads == 0, "bad head counts");
  const int64_t batch = x.size(0), seq = x.size(1), hidden = x.size(2);
  const int64_t head_dim = wq.size(0) / heads;
  TORCH_CHECK(wk.size(0) == kv_heads * head_dim && wv.size(0) == kv_heads * head_dim,
              "k/v projection widths do not match kv_heads * head_dim");
  auto rows = x.reshape({batch * seq, hidden});
  torch::Tensor qkv, q, k, v;
  Layout s{batch, seq, heads, kv_heads, head_dim, 0, 0};
  const float *qp, *kp, *vp;
  if (fuse_qkv) {  // one GEMM over the stacked weights instead of three
    qkv = at::linear(rows, at::cat({wq, wk, wv}, 0)).contiguous();
    s.q_stride = s.kv_stride = qkv.size(1);
    qp = qkv.data_ptr<float>();
    kp = qp + heads * head_dim;
    vp = kp + kv_heads * head_dim;
  } else {
    q = at::linear(rows, wq).contiguous();
    k = at::linear(rows, wk).contiguous();
    v = at::linear(rows, wv).contiguous();
    s.q_stride = heads * head_dim;
    s.kv_stride = kv_heads * head_dim;
    qp = q.data_ptr<float>();
    kp = k.data_ptr<float>();
    vp = v.data_ptr<float>();
  }
  auto attn = torch::empty({batch * seq, heads * head_dim}, x.options());
  const int nthreads = threads > 0 ? static_cast<int>(threads) : at::get_num_threads();
  attend(qp, kp, vp, attn.data_ptr<float>(), s, causal, std::max<int64_t>(1, rows_per_task),
         nthreads);
  return at::linear(attn, wo).view({batch, seq, wo.size(0)});
}
'''

GATED_MLP = r'''
#include <torch/extension.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
@FAST_MATH@
namespace {

inline float silu(float x) { return x / (1.0f + fast_exp(-x)); }

inline float gelu_tanh(float x) {
  const float k = 0.7978845608028654f;  // sqrt(2 / pi)
  return 0.5f * x * (1.0f + fast_tanh(k * (x + 0.044715f * x * x * x)));
}

// out[r, c] = act(gate[r, c]) * up[r, c], rows strided so a stacked GEMM output works too.
template <int Act>
void gate_rows(const float* gate, const float* up, float* out, int64_t rows, int64_t width,
               int64_t in_stride, int64_t rows_per_task, int threads) {
  const int64_t tasks = (rows + rows_per_task - 1) / rows_per_task;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t end = std::min(rows, (t + 1) * rows_per_task);
    for (int64_t r = t * rows_per_task; r < end; ++r) {
      const float* g = gate + r * in_stride;
      const float* u = up + r * in_stride;
      float* o = out + r * width;
#pragma omp simd
      for (int64_t c = 0; c < width; ++c) o[c] = (Act == 0 ? silu(g[c]) : gelu_tanh(g[c])) * u[c];
    }
  }
}

}  // namespace

// down(act(gate(x)) * up(x)); activation 0 = SiLU, 1 = tanh-approximated GELU.
torch::Tensor gated_mlp(torch::Tensor x, torch::Tensor w_gate, torch::Tensor w_up,
                        torch::Tensor w_down, int64_t activation, int64_t rows_per_task,
                        int64_t threads, bool fuse_gate_up) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat, "x must be float32");
  TORCH_CHECK(activation == 0 || activation == 1, "activation must be 0 (silu) or 1 (gelu)");
  const int64_t hidden = x.size(-1), width = w_gate.size(0);
  auto rows = x.reshape({-1, hidden});
  const int64_t n = rows.size(0);
  torch::Tensor gate, up, stacked;
  const float *gp, *up_ptr;
  int64_t in_stride;
  if (fuse_gate_up) {  // one GEMM over the stacked weights
    stacked = at::linear(rows, at::cat({w_gate, w_up}, 0)).contiguous();
    gp = stacked.data_ptr<float>();
    up_ptr = gp + width;
    in_stride = 2 * width;
  } else {
    gate = at::linear(rows, w_gate).contiguous();
    up = at::linear(rows, w_up).contiguous();
    gp = gate.data_ptr<float>();
    up_ptr = up.data_ptr<float>();
    in_stride = width;
  }
  // without stacking the product overwrites the gate buffer: no extra allocation
  auto hidden_act = fuse_gate_up ? torch::empty({n, width}, x.options()) : gate;
  const int nthreads = threads > 0 ? static_cast<int>(threads) : at::get_num_threads();
  const int64_t chunk = std::max<int64_t>(1, rows_per_task);
  if (activation == 0)
    gate_rows<0>(gp, up_ptr, hidden_act.data_ptr<float>(), n, width, in_stride, chunk, nthreads);
  else
    gate_rows<1>(gp, up_ptr, hidden_act.data_ptr<float>(), n, width, in_stride, chunk, nthreads);
  auto out_sizes = x.sizes().vec();
  out_sizes.back() = w_down.size(0);
  return at::linear(hidden_act, w_down).view(out_sizes);
}
'''

PLAIN_MLP = r'''
#include <torch/extension.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
@FAST_MATH@
namespace {

inline float gelu_erf(float x) { return 0.5f * x * (1.0f + fast_erf(x * 0.7071067811865476f)); }

}  // namespace

// fc_out(gelu(fc_in(x))) with exact (erf) GELU; the first bias is added in the GELU pass
// unless bias_in_gemm asks the GEMM to add it.
torch::Tensor plain_mlp(torch::Tensor x, torch::Tensor w_in, torch::Tensor b_in,
                        torch::Tensor w_out, torch::Tensor b_out, int64_t rows_per_task,
                        int64_t threads, bool bias_in_gemm) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat, "x must be float32");
  const int64_t hidden = x.size(-1), width = w_in.size(0);
  auto rows = x.reshape({-1, hidden});
  auto h = (bias_in_gemm ? at::linear(rows, w_in, b_in) : at::linear(rows, w_in)).contiguous();
  auto bias = b_in.contiguous();
  float* hp = h.data_ptr<float>();
  const float* bp = bias.data_ptr<float>();
  const int64_t n = h.size(0);
@ROW_TASKS@
      float* row = hp + r * width;
      if (bias_in_gemm) {
#pragma omp simd
        for (int64_t c = 0; c < width; ++c) row[c] = gelu_erf(row[c]);
      } else {
#pragma omp simd
        for (int64_t c = 0; c < width; ++c) row[c] = gelu_erf(row[c] + bp[c]);
      }
    }
  }
  auto out_sizes = x.sizes().vec();
  out_sizes.back() = w_out.size(0);
  return at::linear(h, w_out, b_out).view(out_sizes);
}
'''

RMSNORM_PROJ = r'''
#include <torch/extension.h>
#include <omp.h>

#include <algorithm>
#include <cmath>

// proj(norm_weight * x / sqrt(mean(x^2) + eps)): the normalisation is one pass per row.
torch::Tensor rmsnorm_linear(torch::Tensor x, torch::Tensor norm_weight, torch::Tensor w,
                             double eps, int64_t rows_per_task, int64_t threads) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat, "x must be float32");
  const int64_t hidden = x.size(-1);
  auto rows = x.reshape({-1, hidden}).contiguous();
  auto weight = norm_weight.contiguous();
  auto normed = torch::empty_like(rows);
  const float* xp = rows.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  float* np_ = normed.data_ptr<float>();
  const int64_t n = rows.size(0);
@ROW_TASKS@
      const float* xr = xp + r * hidden;
      float* yr = np_ + r * hidden;
      float squares = 0.f;
#pragma omp simd reduction(+ : squares)
      for (int64_t c = 0; c < hidden; ++c) squares += xr[c] * xr[c];
      const float inv_rms = 1.0f / std::sqrt(squares / static_cast<float>(hidden) +
                                             static_cast<float>(eps));
#pragma omp simd
      for (int64_t c = 0; c < hidden; ++c) yr[c] = wp[c] * (xr[c] * inv_rms);
    }
  }
  auto out_sizes = x.sizes().vec();
  out_sizes.back() = w.size(0);
  return at::linear(normed, w).view(out_sizes);
}
'''

# The loop head of the row-parallel passes: rows in tasks of rows_per_task, one OpenMP thread
# per task (`threads` of them, 0 = torch's pool); the pass's body follows, indexed by r.
_ROW_TASKS = """\
  const int64_t chunk = std::max<int64_t>(1, rows_per_task);
  const int64_t tasks = (n + chunk - 1) / chunk;
  const int nthreads = threads > 0 ? static_cast<int>(threads) : at::get_num_threads();
#pragma omp parallel for num_threads(nthreads) schedule(static)
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t end = std::min(n, (t + 1) * chunk);
    for (int64_t r = t * chunk; r < end; ++r) {"""

SOURCES = {
    name: source.replace("@FAST_MATH@", _FAST_MATH).replace("@ROW_TASKS@", _ROW_TASKS)
    for name, source in (("attention", ATTENTION), ("gated_mlp", GATED_MLP),
                         ("plain_mlp", PLAIN_MLP), ("rmsnorm_proj", RMSNORM_PROJ))
}
