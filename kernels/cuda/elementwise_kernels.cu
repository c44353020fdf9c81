// The small kernels of the forward pass: dtype conversion at upload, embedding gather,
// residual add fused with RMSNorm, rotary embedding fused with the KV-cache write, SiLU*mul
// (for the rows cuBLAS projects; the projections of 1..64 rows apply it in their epilogue).
//
// At decode sizes they move a few kilobytes a row, so their time is the latency of their
// dependent memory accesses, not bandwidth. Each is written so that a thread issues all of its
// loads before it uses any: a norm row is held in registers, RoPE and SiLU*mul give each thread
// one vector of work. A grid-stride loop over data updated in place would instead wait one
// round trip to memory per iteration, since the compiler cannot move a load above the
// previous iteration's store.
#include <cuda_fp16.h>

#include <stdexcept>
#include <string>

#include "kernels/cuda/bf16_vector.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/silu.cuh"

namespace pipeline::cuda {
namespace {

constexpr int kRowThreads = 256;
constexpr int kWideRowThreads = 512;  // rows wider than kMaxRowVectors float4 a thread at 256
constexpr int kMaxRowVectors = 8;     // float4 a thread holds: 126 registers at most
static_assert(kMaxHiddenSize == 4 * kMaxRowVectors * kWideRowThreads);
constexpr int kItemThreads = 256;
constexpr int kMaxRopeHalf = 128;  // head_dim up to 256, as attention_supports() allows

int grid_for(size_t n, int threads) {
  const size_t blocks = (n + threads - 1) / threads;
  return int(blocks < 65535 * 16 ? blocks : 65535 * 16);  // grid-stride loops cover the rest
}

int blocks_for(size_t items, int threads) {
  return int((items + threads - 1) / threads);
}

int pow2_at_least(int n) {
  int p = 1;
  while (p < n) p <<= 1;
  return p;
}

// The widest bf16 vector (8, 4, 2 or 1 elements) that divides n.
int widest_vector(int n) {
  return n % 8 == 0 ? 8 : n % 4 == 0 ? 4 : n % 2 == 0 ? 2 : 1;
}

struct alignas(16) Float4 {
  float v[4];
};

template <typename Source>
__global__ void convert_kernel(const Source* src, bf16* dst, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    if constexpr (sizeof(Source) == 4) {
      dst[i] = __float2bfloat16(src[i]);
    } else {
      dst[i] = __float2bfloat16(__half2float(src[i]));
    }
  }
}

// One block per token, four elements a thread per pass.
__global__ void embedding_kernel(const bf16* __restrict__ embed, const int32_t* __restrict__ tokens,
                                 int hidden, float* __restrict__ residual) {
  wait_for_previous_kernel();
  allow_next_kernel();
  const int t = blockIdx.x;
  const bf16* row = embed + size_t(tokens[t]) * hidden;
  Float4* out = reinterpret_cast<Float4*>(residual + size_t(t) * hidden);
  for (int c = threadIdx.x; c < hidden / 4; c += blockDim.x) {
    const Bf16Pack<4> in = load_pack<4>(row + 4 * c);
    Float4 f;
#pragma unroll
    for (int k = 0; k < 4; ++k) f.v[k] = __bfloat162float(in.v[k]);
    out[c] = f;
  }
}

// One block per output row; the row is kVectors float4 a thread, all loaded (with the delta and
// the norm weight) before the first is used.
template <int kVectors>
__global__ void __launch_bounds__(kWideRowThreads)
    add_rmsnorm_kernel(float* __restrict__ residual, const bf16* __restrict__ delta,
                       const bf16* __restrict__ weight, const int32_t* __restrict__ rows,
                       int hidden, float eps, bf16* __restrict__ out) {
  __shared__ float scratch[32];
  const int vectors = hidden / 4;
  Bf16Pack<4> wv[kVectors];
  // No kernel writes the norm weight: loaded before waiting for the kernel ahead.
#pragma unroll
  for (int j = 0; j < kVectors; ++j) {
    const int c = threadIdx.x + j * blockDim.x;
    if (c < vectors) wv[j] = load_pack<4>(weight + 4 * c);
  }
  wait_for_previous_kernel();
  allow_next_kernel();

  const int r = blockIdx.x;
  const size_t i = rows ? size_t(rows[r]) : size_t(r);
  Float4* x = reinterpret_cast<Float4*>(residual + i * hidden);
  const bf16* d = delta ? delta + i * hidden : nullptr;
  Float4 v[kVectors];
  Bf16Pack<4> dv[kVectors];
#pragma unroll
  for (int j = 0; j < kVectors; ++j) {
    const int c = threadIdx.x + j * blockDim.x;
    v[j] = Float4{};
    if (c < vectors) {
      v[j] = x[c];
      if (d) dv[j] = load_pack<4>(d + 4 * c);
    }
  }
  float sum_sq = 0.0f;
#pragma unroll
  for (int j = 0; j < kVectors; ++j) {
    const int c = threadIdx.x + j * blockDim.x;
    if (d && c < vectors) {
#pragma unroll
      for (int k = 0; k < 4; ++k) v[j].v[k] += __bfloat162float(dv[j].v[k]);
      x[c] = v[j];
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) sum_sq += v[j].v[k] * v[j].v[k];  // zero past the row's end
  }
  const float inv_rms = rsqrtf(block_sum(sum_sq, scratch) / float(hidden) + eps);
  bf16* y = out + size_t(r) * hidden;
#pragma unroll
  for (int j = 0; j < kVectors; ++j) {
    const int c = threadIdx.x + j * blockDim.x;
    if (c < vectors) {
      Bf16Pack<4> o;
#pragma unroll
      for (int k = 0; k < 4; ++k)
        o.v[k] = __float2bfloat16(v[j].v[k] * inv_rms * __bfloat162float(wv[j].v[k]));
      store_pack<4>(y + 4 * c, o);
    }
  }
}

// Grid (token, chunk of kItemThreads work items). A work item is kVec rotary pairs
// (i .. i + kVec - 1 with their partners at + head_dim/2) of one q or k head, or kVec values of
// v to copy into the cache; each thread has one. Pairs rotate by position * theta^(-2i/head_dim)
// in float32, as Hugging Face's LlamaRotaryEmbedding computes it; the head_dim/2 angles are
// the same for every head, computed once per block into shared memory while the loads are in
// flight. q rotates in place; k and v go to the paged cache at slots[t].
template <int kVec>
__global__ void __launch_bounds__(kItemThreads)
    rope_write_kv_kernel(bf16* __restrict__ qkv, const int32_t* __restrict__ positions,
                         const int32_t* __restrict__ slots, int num_heads, int num_kv_heads,
                         int head_dim, float rope_theta, bf16* __restrict__ k_cache,
                         bf16* __restrict__ v_cache) {
  __shared__ float cos_s[kMaxRopeHalf], sin_s[kMaxRopeHalf];
  wait_for_previous_kernel();
  allow_next_kernel();

  const int t = blockIdx.x;
  const int half = head_dim / 2;
  const int items_per_head = half / kVec;
  const int rope_items = (num_heads + num_kv_heads) * items_per_head;
  const int v_items = num_kv_heads * head_dim / kVec;
  const int item = blockIdx.y * blockDim.x + threadIdx.x;
  const bool is_rope = item < rope_items;
  const bool is_v = !is_rope && item < rope_items + v_items;

  bf16* q = qkv + size_t(t) * (num_heads + 2 * num_kv_heads) * head_dim;
  const bf16* k = q + size_t(num_heads) * head_dim;
  const bf16* v = k + size_t(num_kv_heads) * head_dim;
  const size_t slot_offset = size_t(slots[t]) * num_kv_heads * head_dim;
  const int head = item / items_per_head;
  const int i = (item % items_per_head) * kVec;
  const bool is_q = head < num_heads;
  const size_t head_offset = size_t(is_q ? head : head - num_heads) * head_dim;

  Bf16Pack<kVec> x1{}, x2{};
  if (is_rope) {
    const bf16* src = (is_q ? q : k) + head_offset;
    x1 = load_pack<kVec>(src + i);
    x2 = load_pack<kVec>(src + i + half);
  } else if (is_v) {
    x1 = load_pack<kVec>(v + size_t(item - rope_items) * kVec);
  }

  const float position = float(positions[t]);
  for (int j = threadIdx.x; j < half; j += blockDim.x) {
    const float inv_freq = 1.0f / powf(rope_theta, float(2 * j) / float(head_dim));
    sincosf(position * inv_freq, &sin_s[j], &cos_s[j]);
  }
  __syncthreads();

  if (is_rope) {
    Bf16Pack<kVec> y1, y2;
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      const float a = __bfloat162float(x1.v[e]), b = __bfloat162float(x2.v[e]);
      const float c = cos_s[i + e], s = sin_s[i + e];
      y1.v[e] = __float2bfloat16(a * c - b * s);
      y2.v[e] = __float2bfloat16(b * c + a * s);
    }
    bf16* dst = (is_q ? q : k_cache + slot_offset) + head_offset;
    store_pack<kVec>(dst + i, y1);
    store_pack<kVec>(dst + i + half, y2);
  } else if (is_v) {
    store_pack<kVec>(v_cache + slot_offset + size_t(item - rope_items) * kVec, x1);
  }
}

// One work item of kVec consecutive outputs a thread, from kVec interleaved (gate, up) pairs.
template <int kVec>
__global__ void silu_mul_kernel(const bf16* __restrict__ gate_up, size_t items, int inter,
                                bf16* __restrict__ out) {
  wait_for_previous_kernel();
  allow_next_kernel();
  const size_t item = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (item >= items) return;
  const int per_row = inter / kVec;
  const size_t t = item / per_row, j = (item % per_row) * kVec;
  const Bf16Pack<2 * kVec> pairs = load_pack<2 * kVec>(gate_up + t * 2 * inter + 2 * j);
  Bf16Pack<kVec> y;
#pragma unroll
  for (int e = 0; e < kVec; ++e)
    y.v[e] = __float2bfloat16(silu(__bfloat162float(pairs.v[2 * e])) *
                              __bfloat162float(pairs.v[2 * e + 1]));
  store_pack<kVec>(out + t * inter + j, y);
}

template <int kVectors>
void launch_add_rmsnorm(int threads, float* residual, const bf16* delta, const bf16* weight,
                        const int32_t* rows, int num_rows, int hidden, float eps, bf16* out,
                        cudaStream_t stream) {
  launch_dependent(add_rmsnorm_kernel<kVectors>, num_rows, threads, 0, stream, residual, delta,
                   weight, rows, hidden, eps, out);
}

template <int kVec>
void launch_rope(bf16* qkv, int num_tokens, const int32_t* positions, const int32_t* slots,
                 int num_heads, int num_kv_heads, int head_dim, float rope_theta, bf16* k_cache,
                 bf16* v_cache, cudaStream_t stream) {
  const size_t items = size_t(num_heads + num_kv_heads) * (head_dim / 2 / kVec) +
                       size_t(num_kv_heads) * head_dim / kVec;
  const dim3 grid(num_tokens, blocks_for(items, kItemThreads));
  launch_dependent(rope_write_kv_kernel<kVec>, grid, kItemThreads, 0, stream, qkv, positions, slots,
                   num_heads, num_kv_heads, head_dim, rope_theta, k_cache, v_cache);
}

template <int kVec>
void launch_silu_mul(const bf16* gate_up, int num_tokens, int inter, bf16* out,
                     cudaStream_t stream) {
  const size_t items = size_t(num_tokens) * (inter / kVec);
  launch_dependent(silu_mul_kernel<kVec>, blocks_for(items, kItemThreads), kItemThreads, 0, stream,
                   gate_up, items, inter, out);
}

}  // namespace

bool hidden_size_supported(int hidden, std::string* why) {
  if (hidden > 0 && hidden % 4 == 0 && hidden <= kMaxHiddenSize) return true;
  if (why)
    *why = "hidden_size " + std::to_string(hidden) + " is not a multiple of 4 up to " +
           std::to_string(kMaxHiddenSize) + ", as the CUDA norm kernels need";
  return false;
}

void convert_to_bf16(const void* src, DType src_dtype, bf16* dst, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  const int threads = 256;
  switch (src_dtype) {
    case DType::BF16:
      PIPELINE_CUDA_CHECK(
          cudaMemcpyAsync(dst, src, n * sizeof(bf16), cudaMemcpyDeviceToDevice, stream));
      return;
    case DType::F32:
      convert_kernel<<<grid_for(n, threads), threads, 0, stream>>>(static_cast<const float*>(src),
                                                                   dst, n);
      break;
    case DType::F16:
      convert_kernel<<<grid_for(n, threads), threads, 0, stream>>>(static_cast<const __half*>(src),
                                                                   dst, n);
      break;
  }
  PIPELINE_CUDA_CHECK_LAUNCH();
}

void embedding_gather(const bf16* embed, const int32_t* tokens, int num_tokens, int hidden,
                      float* residual, cudaStream_t stream) {
  launch_dependent(embedding_kernel, num_tokens, kRowThreads, 0, stream, embed, tokens, hidden,
                   residual);
}

void add_rmsnorm(float* residual, const bf16* delta, const bf16* weight, const int32_t* rows,
                 int num_rows, int hidden, float eps, bf16* out, cudaStream_t stream) {
  std::string why;
  if (!hidden_size_supported(hidden, &why)) throw std::invalid_argument("add_rmsnorm: " + why);
  const int vectors = hidden / 4;
  const int threads = vectors <= kMaxRowVectors * kRowThreads ? kRowThreads : kWideRowThreads;
  switch (pow2_at_least((vectors + threads - 1) / threads)) {
    case 1:
      return launch_add_rmsnorm<1>(threads, residual, delta, weight, rows, num_rows, hidden, eps,
                                   out, stream);
    case 2:
      return launch_add_rmsnorm<2>(threads, residual, delta, weight, rows, num_rows, hidden, eps,
                                   out, stream);
    case 4:
      return launch_add_rmsnorm<4>(threads, residual, delta, weight, rows, num_rows, hidden, eps,
                                   out, stream);
    default:
      return launch_add_rmsnorm<kMaxRowVectors>(threads, residual, delta, weight, rows, num_rows,
                                                hidden, eps, out, stream);
  }
}

void rope_write_kv(bf16* qkv, int num_tokens, const int32_t* positions, const int32_t* slots,
                   int num_heads, int num_kv_heads, int head_dim, float rope_theta, bf16* k_cache,
                   bf16* v_cache, cudaStream_t stream) {
  // head_dim is a multiple of 8 (attention_supports), so half of it one of 4.
  if (widest_vector(head_dim / 2) == 8)
    return launch_rope<8>(qkv, num_tokens, positions, slots, num_heads, num_kv_heads, head_dim,
                          rope_theta, k_cache, v_cache, stream);
  launch_rope<4>(qkv, num_tokens, positions, slots, num_heads, num_kv_heads, head_dim, rope_theta,
                 k_cache, v_cache, stream);
}

void silu_mul(const bf16* gate_up, int num_tokens, int inter, bf16* out, cudaStream_t stream) {
  switch (widest_vector(inter)) {  // 2 * kVec inputs a thread: 16 bytes at most
    case 8:
    case 4:
      return launch_silu_mul<4>(gate_up, num_tokens, inter, out, stream);
    case 2:
      return launch_silu_mul<2>(gate_up, num_tokens, inter, out, stream);
    default:
      return launch_silu_mul<1>(gate_up, num_tokens, inter, out, stream);
  }
}

}  // namespace pipeline::cuda
