"""CUDA operator sources of the `templates` author for the cuda backend.

As on cpu, each source reads every size from its tensors (one build per kernel and
machine), dense projections stay on ATen's GEMM (cuBLAS, as in the reference), and the
kernels replace what lies between them: a flash-style attention kernel that never
materialises scores, masks or repeated kv heads; the activation (and bias) fused into one
pass over the GEMM output; RMSNorm as one block per row. Launch settings are runtime
arguments, so attempts with different variants share the build."""

ATTENTION = r'''
#include <torch/extension.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <cmath>

namespace {

constexpr int kWarps = 4;  // warps per block
constexpr int kKeys = 32;  // keys per shared-memory tile: one per lane

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// One (batch, head) and kWarps * Rows query rows per block. K/V tiles live in shared memory,
// rows padded by four floats so that the lanes' 16-byte reads of different keys spread over
// the banks. Each lane scores one key of the tile for each of its warp's Rows queries; the
// softmax is online (running max and sum per row), so no score matrix is ever written.
// Output lanes own head_dim / 32 columns each (Chunks). head_dim is a multiple of 4.
template <int Rows, int Chunks>
__global__ void attention_kernel(const float* __restrict__ q, const float* __restrict__ k,
                                 const float* __restrict__ v, float* __restrict__ out, int seq,
                                 int heads, int group, int head_dim, long q_stride,
                                 long kv_stride, float scale, bool causal) {
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  const int pitch = head_dim + 4;
  const int quads = head_dim / 4;
  float* k_tile = smem;
  float* v_tile = k_tile + kKeys * pitch;
  float* q_tile = v_tile + kKeys * pitch;
  float* p_tile = q_tile + kWarps * Rows * head_dim;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int b = blockIdx.z, h = blockIdx.y;
  const int block_row0 = blockIdx.x * kWarps * Rows;
  const int row0 = block_row0 + warp * Rows;
  const float* q_base = q + (long)b * seq * q_stride + (long)h * head_dim;
  const float* k_base = k + (long)b * seq * kv_stride + (long)(h / group) * head_dim;
  const float* v_base = v + (long)b * seq * kv_stride + (long)(h / group) * head_dim;

  for (int idx = threadIdx.x; idx < kWarps * Rows * quads; idx += blockDim.x) {
    const int r = idx / quads, d = (idx - r * quads) * 4;
    const int row = block_row0 + r;
    float4 value = make_float4(0.f, 0.f, 0.f, 0.f);
    if (row < seq) {
      value = *reinterpret_cast<const float4*>(q_base + (long)row * q_stride + d);
      value.x *= scale;
      value.y *= scale;
      value.z *= scale;
      value.w *= scale;
    }
    *reinterpret_cast<float4*>(q_tile + r * head_dim + d) = value;
  }

  float m[Rows], l[Rows], acc[Rows][Chunks];
#pragma unroll
  for (int r = 0; r < Rows; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.f;
#pragma unroll
    for (int c = 0; c < Chunks; ++c) acc[r][c] = 0.f;
  }

  const int block_last = min(seq, block_row0 + kWarps * Rows) - 1;
  const int key_end = causal ? block_last + 1 : seq;
  for (int t0 = 0; t0 < key_end; t0 += kKeys) {
    __syncthreads();  // the previous tile is consumed (and the queries are staged)
    for (int idx = threadIdx.x; idx < kKeys * quads; idx += blockDim.x) {
      const int j = idx / quads, d = (idx - j * quads) * 4;
      const int key = t0 + j;
      float4 kq = make_float4(0.f, 0.f, 0.f, 0.f), vq = kq;
      if (key < seq) {
        kq = *reinterpret_cast<const float4*>(k_base + (long)key * kv_stride + d);
        vq = *reinterpret_cast<const float4*>(v_base + (long)key * kv_stride + d);
      }
      *reinterpret_cast<float4*>(k_tile + j * pitch + d) = kq;
      *reinterpret_cast<float4*>(v_tile + j * pitch + d) = vq;
    }
    __syncthreads();
    if (row0 >= seq || (causal && t0 > row0 + Rows - 1)) continue;  // nothing this warp sees

    float s[Rows];
#pragma unroll
    for (int r = 0; r < Rows; ++r) s[r] = 0.f;
    const float4* k_row = reinterpret_cast<const float4*>(k_tile + lane * pitch);
    const float4* q_rows = reinterpret_cast<const float4*>(q_tile + warp * Rows * head_dim);
    for (int d4 = 0; d4 < quads; ++d4) {
      const float4 kq = k_row[d4];
#pragma unroll
      for (int r = 0; r < Rows; ++r) {
        const float4 qq = q_rows[r * quads + d4];  // the same address in every lane: a broadcast
        s[r] = fmaf(qq.x, kq.x, s[r]);
        s[r] = fmaf(qq.y, kq.y, s[r]);
        s[r] = fmaf(qq.z, kq.z, s[r]);
        s[r] = fmaf(qq.w, kq.w, s[r]);
      }
    }
    const int key = t0 + lane;
    float* p_rows = p_tile + warp * Rows * kKeys;
#pragma unroll
    for (int r = 0; r < Rows; ++r) {
      const int row = row0 + r;
      const bool valid = key < seq && row < seq && (!causal || key <= row);
      const float score = valid ? s[r] : -INFINITY;
      const float m_new = fmaxf(m[r], warp_max(score));
      const float p = valid ? expf(score - m_new) : 0.f;
      const float alpha = m_new == -INFINITY ? 1.f : expf(m[r] - m_new);
      l[r] = l[r] * alpha + warp_sum(p);
      m[r] = m_new;
      p_rows[r * kKeys + lane] = p;
#pragma unroll
      for (int c = 0; c < Chunks; ++c) acc[r][c] *= alpha;
    }
    __syncwarp();
    const int tile_keys = min(kKeys, seq - t0);
    for (int j = 0; j < tile_keys; ++j) {
      const float* v_row = v_tile + j * pitch;
#pragma unroll
      for (int c = 0; c < Chunks; ++c) {
        const int d = lane + 32 * c;
        const float vd = d < head_dim ? v_row[d] : 0.f;
#pragma unroll
        for (int r = 0; r < Rows; ++r) acc[r][c] = fmaf(p_rows[r * kKeys + j], vd, acc[r][c]);
      }
    }
  }

  const long out_stride = (long)heads * head_dim;
#pragma unroll
  for (int r = 0; r < Rows; ++r) {
    const int row = row0 + r;
    if (row >= seq) continue;
    float* o = out + ((long)b * seq + row) * out_stride + (long)h * head_dim;
    const float inv = 1.f / l[r];
#pragma unroll
    for (int c = 0; c < Chunks; ++c) {
      const int d = lane + 32 * c;
      if (d < head_dim) o[d] = acc[r][c] * inv;
    }
  }
}

struct Problem {
  const float *q, *k, *v;
  float* out;
  int batch, seq, heads, group, head_dim;
  long q_stride, kv_stride;
  bool causal;
};

template <int Rows, int Chunks>
void launch(const Problem& p) {
  const size_t floats = 2 * kKeys * (p.head_dim + 4) + kWarps * Rows * (p.head_dim + kKeys);
  const size_t bytes = floats * sizeof(float);
  auto kernel = attention_kernel<Rows, Chunks>;
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(bytes)));
  const dim3 grid((p.seq + kWarps * Rows - 1) / (kWarps * Rows), p.heads, p.batch);
  kernel<<<grid, kWarps * 32, bytes, c10::cuda::getCurrentCUDAStream()>>>(
      p.q, p.k, p.v, p.out, p.seq, p.heads, p.group, p.head_dim, p.q_stride, p.kv_stride,
      1.f / sqrtf(static_cast<float>(p.head_dim)), p.causal);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <int Rows>
void launch_chunks(const Problem& p) {
  const int chunks = (p.head_dim + 31) / 32;
  if (chunks <= 1) launch<Rows, 1>(p);
  else if (chunks <= 2) launch<Rows, 2>(p);
  else if (chunks <= 4) launch<Rows, 4>(p);
  else launch<Rows, 8>(p);
}

}  // namespace

// Whole attention block: q/k/v projections (cuBLAS), fused attention, output projection.
torch::Tensor attention_block(torch::Tensor x, torch::Tensor wq, torch::Tensor wk,
                              torch::Tensor wv, torch::Tensor wo, int64_t heads,
                              int64_t kv_heads, bool causal, int64_t rows_per_warp,
                              bool fuse_qkv) {
  TORCH_CHECK(x.is_cuda() && x.dim() == 3 && x.scalar_type() == torch::kFloat,
              "x must be a float32 CUDA tensor [batch, seq, hidden]");
  TORCH_CHECK(heads > 0 && kv_heads > 0 && heads % kv_heads == 0, "bad head counts");
  const int64_t batch = x.size(0), seq = x.size(1), hidden = x.size(2);
  const int64_t head_dim = wq.size(0) / heads;
  TORCH_CHECK(head_dim <= 256 && head_dim % 4 == 0,
              "head_dim must be a multiple of 4 and at most 256");
  TORCH_CHECK(wk.size(0) == kv_heads * head_dim && wv.size(0) == kv_heads * head_dim,
              "k/v projection widths do not match kv_heads * head_dim");
  const c10::cuda::OptionalCUDAGuard guard(x.device());
  auto rows = x.reshape({batch * seq, hidden});
  Problem p;
  p.batch = batch;
  p.seq = seq;
  p.heads = heads;
  p.group = heads / kv_heads;
  p.head_dim = head_dim;
  p.causal = causal;
  torch::Tensor qkv, q, k, v;
  if (fuse_qkv) {  // one GEMM over the stacked weights instead of three
    qkv = at::linear(rows, at::cat({wq, wk, wv}, 0)).contiguous();
    p.q_stride = p.kv_stride = qkv.size(1);
    p.q = qkv.data_ptr<float>();
    p.k = p.q + heads * head_dim;
    p.v = p.k + kv_heads * head_dim;
  } else {
    q = at::linear(rows, wq).contiguous();
    k = at::linear(rows, wk).contiguous();
    v = at::linear(rows, wv).contiguous();
    p.q_stride = heads * head_dim;
    p.kv_stride = kv_heads * head_dim;
    p.q = q.data_ptr<float>();
    p.k = k.data_ptr<float>();
    p.v = v.data_ptr<float>();
  }
  auto attn = torch::empty({batch * seq, heads * head_dim}, x.options());
  p.out = attn.data_ptr<float>();
  if (rows_per_warp >= 4) launch_chunks<4>(p);
  else if (rows_per_warp >= 2) launch_chunks<2>(p);
  else launch_chunks<1>(p);
  return at::linear(attn, wo).view({batch, seq, wo.size(0)});
}
'''

GATED_MLP = r'''
#include <torch/extension.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <algorithm>

namespace {

__device__ __forceinline__ float silu(float x) { return x / (1.f + expf(-x)); }

__device__ __forceinline__ float gelu_tanh(float x) {
  const float k = 0.7978845608028654f;  // sqrt(2 / pi)
  return 0.5f * x * (1.f + tanhf(k * (x + 0.044715f * x * x * x)));
}

template <int Act>
__device__ __forceinline__ float gated(float g, float u) {
  return (Act == 0 ? silu(g) : gelu_tanh(g)) * u;
}

// out[r, c] = act(gate[r, c]) * up[r, c]; gate and up rows are in_stride apart, so the
// halves of one stacked GEMM output work as well as two separate ones. Four columns per
// thread when the rows allow 16-byte loads.
template <int Act>
__global__ void gate_kernel(const float* __restrict__ gate, const float* __restrict__ up,
                            float* __restrict__ out, long rows, long width, long in_stride,
                            bool vector4) {
  const long step = (long)gridDim.x * blockDim.x;
  if (vector4) {
    const long quads = width / 4, n = rows * quads;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
      const long r = i / quads, c = (i - r * quads) * 4;
      const float4 g = *reinterpret_cast<const float4*>(gate + r * in_stride + c);
      const float4 u = *reinterpret_cast<const float4*>(up + r * in_stride + c);
      float4 o;
      o.x = gated<Act>(g.x, u.x);
      o.y = gated<Act>(g.y, u.y);
      o.z = gated<Act>(g.z, u.z);
      o.w = gated<Act>(g.w, u.w);
      *reinterpret_cast<float4*>(out + r * width + c) = o;
    }
    return;
  }
  const long n = rows * width;
  for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
    const long r = i / width, c = i - r * width;
    out[i] = gated<Act>(gate[r * in_stride + c], up[r * in_stride + c]);
  }
}

@SM_COUNT@

}  // namespace

// down(act(gate(x)) * up(x)); activation 0 = SiLU, 1 = tanh-approximated GELU.
torch::Tensor gated_mlp(torch::Tensor x, torch::Tensor w_gate, torch::Tensor w_up,
                        torch::Tensor w_down, int64_t activation, int64_t threads_per_block,
                        bool fuse_gate_up) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat, "x must be a float32 CUDA tensor");
  TORCH_CHECK(activation == 0 || activation == 1, "activation must be 0 (silu) or 1 (gelu)");
  const c10::cuda::OptionalCUDAGuard guard(x.device());
  const int64_t hidden = x.size(-1), width = w_gate.size(0);
  auto rows = x.reshape({-1, hidden});
  const int64_t n = rows.size(0);
  torch::Tensor gate, up, stacked, result;
  const float *gp, *upp;
  int64_t in_stride;
  if (fuse_gate_up) {  // one GEMM over the stacked weights
    stacked = at::linear(rows, at::cat({w_gate, w_up}, 0)).contiguous();
    gp = stacked.data_ptr<float>();
    upp = gp + width;
    in_stride = 2 * width;
    result = torch::empty({n, width}, x.options());
  } else {  // the product overwrites the gate buffer: no extra allocation
    gate = at::linear(rows, w_gate).contiguous();
    up = at::linear(rows, w_up).contiguous();
    gp = gate.data_ptr<float>();
    upp = up.data_ptr<float>();
    in_stride = width;
    result = gate;
  }
  const bool vector4 = width % 4 == 0;
  const int threads = static_cast<int>(std::max<int64_t>(32, std::min<int64_t>(1024, threads_per_block)));
  const long work = vector4 ? n * (width / 4) : n * width;
  const int sms = sm_count();
  const int blocks = static_cast<int>(std::max<long>(1, std::min<long>((work + threads - 1) / threads, sms * 16L)));
  auto stream = c10::cuda::getCurrentCUDAStream();
  if (activation == 0)
    gate_kernel<0><<<blocks, threads, 0, stream>>>(gp, upp, result.data_ptr<float>(), n, width, in_stride, vector4);
  else
    gate_kernel<1><<<blocks, threads, 0, stream>>>(gp, upp, result.data_ptr<float>(), n, width, in_stride, vector4);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  auto out_sizes = x.sizes().vec();
  out_sizes.back() = w_down.size(0);
  return at::linear(result, w_down).view(out_sizes);
}
'''

PLAIN_MLP = r'''
#include <torch/extension.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <algorithm>

namespace {

__device__ __forceinline__ float gelu_erf(float x) { return 0.5f * x * (1.f + erff(x * 0.7071067811865476f)); }

// h = gelu(h + bias) in place (bias may be null when the GEMM already added it).
__global__ void bias_gelu_kernel(float* __restrict__ h, const float* __restrict__ bias,
                                 long rows, long width) {
  const long n = rows * width, step = (long)gridDim.x * blockDim.x;
  for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
    const float b = bias == nullptr ? 0.f : bias[i % width];
    h[i] = gelu_erf(h[i] + b);
  }
}

@SM_COUNT@

}  // namespace

// fc_out(gelu(fc_in(x))) with exact (erf) GELU; the first bias is added in the GELU pass
// unless bias_in_gemm asks the GEMM to add it.
torch::Tensor plain_mlp(torch::Tensor x, torch::Tensor w_in, torch::Tensor b_in,
                        torch::Tensor w_out, torch::Tensor b_out, int64_t threads_per_block,
                        bool bias_in_gemm) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat, "x must be a float32 CUDA tensor");
  const c10::cuda::OptionalCUDAGuard guard(x.device());
  const int64_t hidden = x.size(-1), width = w_in.size(0);
  auto rows = x.reshape({-1, hidden});
  auto h = (bias_in_gemm ? at::linear(rows, w_in, b_in) : at::linear(rows, w_in)).contiguous();
  auto bias = b_in.contiguous();
  const int64_t n = h.size(0);
  const int threads = static_cast<int>(std::max<int64_t>(32, std::min<int64_t>(1024, threads_per_block)));
  const int sms = sm_count();
  const int blocks = static_cast<int>(std::max<long>(1, std::min<long>((n * width + threads - 1) / threads, sms * 16L)));
  bias_gelu_kernel<<<blocks, threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      h.data_ptr<float>(), bias_in_gemm ? nullptr : bias.data_ptr<float>(), n, width);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  auto out_sizes = x.sizes().vec();
  out_sizes.back() = w_out.size(0);
  return at::linear(h, w_out, b_out).view(out_sizes);
}
'''

RMSNORM_PROJ = r'''
#include <torch/extension.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <algorithm>

namespace {

// One block per row: sum of squares reduced through warp shuffles, then the scaled write.
__global__ void rmsnorm_kernel(const float* __restrict__ x, const float* __restrict__ weight,
                               float* __restrict__ y, int hidden, float eps) {
  __shared__ float partial[32];
  __shared__ float inv_rms;
  const float* xr = x + (long)blockIdx.x * hidden;
  float* yr = y + (long)blockIdx.x * hidden;
  float sum = 0.f;
  for (int c = threadIdx.x; c < hidden; c += blockDim.x) sum = fmaf(xr[c], xr[c], sum);
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) partial[warp] = sum;
  __syncthreads();
  if (warp == 0) {
    const int warps = (blockDim.x + 31) / 32;
    sum = lane < warps ? partial[lane] : 0.f;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (lane == 0) inv_rms = 1.f / sqrtf(sum / hidden + eps);
  }
  __syncthreads();
  const float scale = inv_rms;
  for (int c = threadIdx.x; c < hidden; c += blockDim.x) yr[c] = weight[c] * (xr[c] * scale);
}

}  // namespace

// proj(norm_weight * x / sqrt(mean(x^2) + eps)) with the normalisation in one kernel.
torch::Tensor rmsnorm_linear(torch::Tensor x, torch::Tensor norm_weight, torch::Tensor w,
                             double eps, int64_t threads_per_block) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat, "x must be a float32 CUDA tensor");
  const c10::cuda::OptionalCUDAGuard guard(x.device());
  const int64_t hidden = x.size(-1);
  auto rows = x.reshape({-1, hidden}).contiguous();
  auto weight = norm_weight.contiguous();
  auto normed = torch::empty_like(rows);
  const int threads = static_cast<int>(std::max<int64_t>(32, std::min<int64_t>(1024, threads_per_block)) / 32 * 32);
  if (rows.size(0) > 0) {
    rmsnorm_kernel<<<rows.size(0), threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
        rows.data_ptr<float>(), weight.data_ptr<float>(), normed.data_ptr<float>(),
        static_cast<int>(hidden), static_cast<float>(eps));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  auto out_sizes = x.sizes().vec();
  out_sizes.back() = w.size(0);
  return at::linear(normed, w).view(out_sizes);
}
'''

# The number of SMs on the current device, for grid sizes (in the sources that need it).
_SM_COUNT = """\
int sm_count() {
  int device = 0, sms = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}"""

SOURCES = {
    name: source.replace("@SM_COUNT@", _SM_COUNT)
    for name, source in (("attention", ATTENTION), ("gated_mlp", GATED_MLP),
                         ("plain_mlp", PLAIN_MLP), ("rmsnorm_proj", RMSNORM_PROJ))
}

# C++ prototypes for load_inline's cpp_sources (it writes the Python bindings from them).
DECLARATIONS = {
    "attention": (
        "torch::Tensor attention_block(torch::Tensor x, torch::Tensor wq, torch::Tensor wk, "
        "torch::Tensor wv, torch::Tensor wo, int64_t heads, int64_t kv_heads, bool causal, "
        "int64_t rows_per_warp, bool fuse_qkv);"
    ),
    "gated_mlp": (
        "torch::Tensor gated_mlp(torch::Tensor x, torch::Tensor w_gate, torch::Tensor w_up, "
        "torch::Tensor w_down, int64_t activation, int64_t threads_per_block, bool fuse_gate_up);"
    ),
    "plain_mlp": (
        "torch::Tensor plain_mlp(torch::Tensor x, torch::Tensor w_in, torch::Tensor b_in, "
        "torch::Tensor w_out, torch::Tensor b_out, int64_t threads_per_block, bool bias_in_gemm);"
    ),
    "rmsnorm_proj": (
        "torch::Tensor rmsnorm_linear(torch::Tensor x, torch::Tensor norm_weight, torch::Tensor w, "
        "double eps, int64_t threads_per_block);"
    ),
}
