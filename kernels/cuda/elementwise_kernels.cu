// The small kernels of the forward pass: dtype conversion at upload, embedding gather,
// residual add fused with RMSNorm, rotary embedding fused with the KV-cache write, SiLU*mul.
// All are memory-bound and cheap next to the GEMMs; they favour simple coalesced loops.
#include <cuda_fp16.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/reduce.cuh"

namespace pipeline::cuda {
namespace {

constexpr int kRowThreads = 256;
constexpr int kMaxRopeHalf = 128;  // head_dim up to 256, as attention_supports() allows

int grid_for(size_t n, int threads) {
  const size_t blocks = (n + threads - 1) / threads;
  return int(blocks < 65535 * 16 ? blocks : 65535 * 16);  // grid-stride loops cover the rest
}

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

__global__ void embedding_kernel(const bf16* embed, const int32_t* tokens, int hidden,
                                 float* residual) {
  wait_for_previous_kernel();
  allow_next_kernel();
  const int t = blockIdx.x;
  const bf16* row = embed + size_t(tokens[t]) * hidden;
  float* out = residual + size_t(t) * hidden;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) out[i] = __bfloat162float(row[i]);
}

__global__ void add_rmsnorm_kernel(float* residual, const bf16* delta, const bf16* weight,
                                   const int32_t* rows, int hidden, float eps, bf16* out) {
  __shared__ float scratch[32];
  wait_for_previous_kernel();
  allow_next_kernel();

  const int r = blockIdx.x;
  const size_t i = rows ? size_t(rows[r]) : size_t(r);
  float* x = residual + i * hidden;
  const bf16* d = delta ? delta + i * hidden : nullptr;
  float sum_sq = 0.0f;
  for (int c = threadIdx.x; c < hidden; c += blockDim.x) {
    float v = x[c];
    if (d) {
      v += __bfloat162float(d[c]);
      x[c] = v;
    }
    sum_sq += v * v;
  }
  const float inv_rms = rsqrtf(block_sum(sum_sq, scratch) / float(hidden) + eps);
  bf16* y = out + size_t(r) * hidden;
  // Each thread re-reads only the elements it wrote itself, so no barrier is needed here.
  for (int c = threadIdx.x; c < hidden; c += blockDim.x)
    y[c] = __float2bfloat16(x[c] * inv_rms * __bfloat162float(weight[c]));
}

// One block per token. Pairs (i, i + head_dim/2) of every q and k head rotate by
// position * theta^(-2i/head_dim), computed in float32 as Hugging Face's LlamaRotaryEmbedding.
// The head_dim/2 angles are the same for every head: computed once per token into shared memory.
__global__ void rope_write_kv_kernel(bf16* qkv, const int32_t* positions, const int32_t* slots,
                                     int num_heads, int num_kv_heads, int head_dim,
                                     float rope_theta, bf16* k_cache, bf16* v_cache) {
  __shared__ float cos_s[kMaxRopeHalf], sin_s[kMaxRopeHalf];
  wait_for_previous_kernel();
  allow_next_kernel();

  const int t = blockIdx.x;
  const int half = head_dim / 2;
  const int qkv_stride = (num_heads + 2 * num_kv_heads) * head_dim;
  bf16* q = qkv + size_t(t) * qkv_stride;
  const bf16* k = q + num_heads * head_dim;
  const bf16* v = k + num_kv_heads * head_dim;
  const float position = float(positions[t]);
  const size_t slot_offset = size_t(slots[t]) * num_kv_heads * head_dim;
  bf16* k_dst = k_cache + slot_offset;
  bf16* v_dst = v_cache + slot_offset;

  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const float inv_freq = 1.0f / powf(rope_theta, float(2 * i) / float(head_dim));
    sincosf(position * inv_freq, &sin_s[i], &cos_s[i]);
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < (num_heads + num_kv_heads) * half; idx += blockDim.x) {
    const int head = idx / half, i = idx % half;
    const bool is_q = head < num_heads;
    const size_t base = is_q ? size_t(head) * head_dim : size_t(head - num_heads) * head_dim;
    const bf16* src = is_q ? q : k;
    const float x1 = __bfloat162float(src[base + i]);
    const float x2 = __bfloat162float(src[base + i + half]);
    bf16* dst = is_q ? q : k_dst;
    dst[base + i] = __float2bfloat16(x1 * cos_s[i] - x2 * sin_s[i]);
    dst[base + i + half] = __float2bfloat16(x2 * cos_s[i] + x1 * sin_s[i]);
  }
  for (int idx = threadIdx.x; idx < num_kv_heads * head_dim; idx += blockDim.x) v_dst[idx] = v[idx];
}

__global__ void silu_mul_kernel(const bf16* gate_up, size_t n, int inter, bf16* out) {
  wait_for_previous_kernel();
  allow_next_kernel();

  for (size_t idx = blockIdx.x * size_t(blockDim.x) + threadIdx.x; idx < n;
       idx += size_t(gridDim.x) * blockDim.x) {
    const size_t t = idx / inter, j = idx % inter;
    const float g = __bfloat162float(gate_up[t * 2 * inter + j]);
    const float u = __bfloat162float(gate_up[t * 2 * inter + inter + j]);
    out[idx] = __float2bfloat16(g / (1.0f + expf(-g)) * u);
  }
}

}  // namespace

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
  launch_dependent(add_rmsnorm_kernel, num_rows, kRowThreads, 0, stream, residual, delta, weight,
                   rows, hidden, eps, out);
}

void rope_write_kv(bf16* qkv, int num_tokens, const int32_t* positions, const int32_t* slots,
                   int num_heads, int num_kv_heads, int head_dim, float rope_theta, bf16* k_cache,
                   bf16* v_cache, cudaStream_t stream) {
  launch_dependent(rope_write_kv_kernel, num_tokens, 128, 0, stream, qkv, positions, slots,
                   num_heads, num_kv_heads, head_dim, rope_theta, k_cache, v_cache);
}

void silu_mul(const bf16* gate_up, int num_tokens, int inter, bf16* out, cudaStream_t stream) {
  const size_t n = size_t(num_tokens) * inter;
  const int threads = 256;
  launch_dependent(silu_mul_kernel, grid_for(n, threads), threads, 0, stream, gate_up, n, inter,
                   out);
}

}  // namespace pipeline::cuda
