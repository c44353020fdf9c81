// Paged-attention decode, flash-decoding style: each sequence's cached positions are cut into
// partitions of kDecodePartition; one block scores one partition for all query heads that
// share a KV head (grouped-query attention reads each K/V row once), keeps a normalised partial
// output with its max and sum, and a second kernel merges the partials of every head.
//
// The grid always spans `max_splits` partitions so a captured CUDA graph serves any context
// length; blocks past a sequence's length exit at once.
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/reduce.cuh"

namespace pipeline::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxGroup = 8;         // query heads per KV head
constexpr int kMaxGroupDims = 1024;  // query heads per KV head * head_dim
constexpr int kMaxHeadDim = 256;
constexpr int kUnroll = 4;  // K/V rows each thread has in flight before using them

// A thread group of `group_threads` lanes (a power of two, at most 32) covers one cached row
// of head_dim bf16 with one 16-byte load per lane.
__device__ __forceinline__ int threads_per_row(int head_dim) {
  int t = 1;
  while (t * 8 < head_dim) t <<= 1;
  return t;
}

__device__ __forceinline__ void unpack8(const uint4& raw, float* out) {
  const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 f = __bfloat1622float2(pairs[j]);
    out[2 * j] = f.x;
    out[2 * j + 1] = f.y;
  }
}

__global__ void __launch_bounds__(kThreads)
    decode_partition_kernel(const bf16* q, int q_stride, PagedKv kv, const int32_t* context_lens,
                            int num_heads, int max_splits, DecodeScratch scratch) {
  __shared__ __align__(16) float q_s[kMaxGroupDims];
  __shared__ float p_s[kMaxGroup * kDecodePartition];
  __shared__ __align__(16) float red_s[kWarps * kMaxGroupDims];
  __shared__ float stat_s[32];
  __shared__ float max_s[kMaxGroup], sum_s[kMaxGroup];

  const int split = blockIdx.x, kv_head = blockIdx.y, seq = blockIdx.z;
  const int context = context_lens[seq];
  const int begin = split * kDecodePartition;
  if (begin >= context) return;  // uniform across the block
  const int n = min(kDecodePartition, context - begin);

  const int D = kv.head_dim;
  const int group = num_heads / kv.num_kv_heads;
  const int first_head = kv_head * group;
  const float scale = rsqrtf(float(D));
  const bf16* q_row = q + size_t(seq) * q_stride + size_t(first_head) * D;
  for (int i = threadIdx.x; i < group * D; i += kThreads)
    q_s[i] = __bfloat162float(q_row[i]) * scale;
  __syncthreads();

  const int row_threads = threads_per_row(D);
  const int rows_per_pass = kThreads / row_threads;
  const int row_in_pass = threadIdx.x / row_threads;
  const int lane = threadIdx.x % row_threads;
  const int d0 = lane * 8;
  const bool lane_active = d0 < D;
  const size_t slot_stride = size_t(kv.num_kv_heads) * D;
  const int32_t* table = kv.block_tables + size_t(seq) * kv.max_blocks_per_seq;

  // Element offset of partition row i (position begin + i) for this lane, in K and V alike.
  auto row_offset = [&](int i) {
    const int position = begin + i;
    const size_t block = size_t(table[position / kv.block_size]);
    const size_t slot = block * kv.block_size + position % kv.block_size;
    return slot * slot_stride + size_t(kv_head) * D + d0;
  };

  // Pass 1: scores q.k for every row of the partition and every query head of the group.
  for (int base = 0; base < n; base += rows_per_pass * kUnroll) {
    uint4 raw[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = base + u * rows_per_pass + row_in_pass;
      raw[u] = make_uint4(0, 0, 0, 0);
      if (i < n && lane_active) raw[u] = *reinterpret_cast<const uint4*>(kv.k + row_offset(i));
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = base + u * rows_per_pass + row_in_pass;
      float k[8];
      unpack8(raw[u], k);
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) {
        if (g >= group) break;  // uniform: every lane takes part in the shuffles below
        float dot = 0.0f;
        if (lane_active) {
          const float4 qa = *reinterpret_cast<const float4*>(q_s + g * D + d0);
          const float4 qb = *reinterpret_cast<const float4*>(q_s + g * D + d0 + 4);
          dot = qa.x * k[0] + qa.y * k[1] + qa.z * k[2] + qa.w * k[3] + qb.x * k[4] + qb.y * k[5] +
                qb.z * k[6] + qb.w * k[7];
        }
        for (int offset = row_threads / 2; offset > 0; offset >>= 1)
          dot += __shfl_xor_sync(0xffffffffu, dot, offset);
        if (lane == 0 && i < n) p_s[g * kDecodePartition + i] = dot;
      }
    }
  }
  __syncthreads();

  // Softmax statistics of the partition, one query head at a time.
  for (int g = 0; g < group; ++g) {
    float local_max = -INFINITY;
    for (int i = threadIdx.x; i < n; i += kThreads)
      local_max = fmaxf(local_max, p_s[g * kDecodePartition + i]);
    const float m = block_max(local_max, stat_s);
    float local_sum = 0.0f;
    for (int i = threadIdx.x; i < n; i += kThreads) {
      const float p = expf(p_s[g * kDecodePartition + i] - m);
      p_s[g * kDecodePartition + i] = p;
      local_sum += p;
    }
    const float l = block_sum(local_sum, stat_s);
    if (threadIdx.x == 0) {
      max_s[g] = m;
      sum_s[g] = l;
    }
  }
  __syncthreads();

  // Pass 2: acc[g][:] = sum_i p[g][i] * v[i][d0 .. d0+7].
  float acc[kMaxGroup][8];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g)
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[g][j] = 0.0f;
  for (int base = 0; base < n; base += rows_per_pass * kUnroll) {
    uint4 raw[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = base + u * rows_per_pass + row_in_pass;
      raw[u] = make_uint4(0, 0, 0, 0);
      if (i < n && lane_active) raw[u] = *reinterpret_cast<const uint4*>(kv.v + row_offset(i));
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = base + u * rows_per_pass + row_in_pass;
      if (i >= n) continue;
      float v[8];
      unpack8(raw[u], v);
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) {
        if (g >= group) break;
        const float p = p_s[g * kDecodePartition + i];
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[g][j] += p * v[j];
      }
    }
  }

  // Merge the row groups of each warp (lanes row_threads apart hold the same columns), then
  // the warps through shared memory.
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    if (g >= group) break;
#pragma unroll
    for (int j = 0; j < 8; ++j)
      for (int offset = row_threads; offset < 32; offset <<= 1)
        acc[g][j] += __shfl_xor_sync(0xffffffffu, acc[g][j], offset);
  }
  const int warp = threadIdx.x / 32;
  if (threadIdx.x % 32 < row_threads && lane_active) {
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      if (g >= group) break;
#pragma unroll
      for (int j = 0; j < 8; ++j) red_s[warp * group * D + g * D + d0 + j] = acc[g][j];
    }
  }
  __syncthreads();

  const size_t head_base = size_t(seq) * num_heads + first_head;
  for (int idx = threadIdx.x; idx < group * D; idx += kThreads) {
    float total = 0.0f;
    for (int w = 0; w < kWarps; ++w) total += red_s[w * group * D + idx];
    const int g = idx / D, d = idx % D;
    scratch.out[((head_base + g) * max_splits + split) * D + d] = total / sum_s[g];
  }
  if (threadIdx.x < group) {
    scratch.max[(head_base + threadIdx.x) * max_splits + split] = max_s[threadIdx.x];
    scratch.sum[(head_base + threadIdx.x) * max_splits + split] = sum_s[threadIdx.x];
  }
}

// One block per (head, sequence): out = sum_p w_p * out_p / sum_p w_p, w_p = sum_p * e^(max_p - M).
__global__ void decode_merge_kernel(const int32_t* context_lens, int num_heads, int head_dim,
                                    int max_splits, DecodeScratch scratch, bf16* out) {
  const int head = blockIdx.x, seq = blockIdx.y;
  const int splits = (context_lens[seq] + kDecodePartition - 1) / kDecodePartition;
  const size_t base = (size_t(seq) * num_heads + head) * max_splits;
  float global_max = -INFINITY;
  for (int p = 0; p < splits; ++p) global_max = fmaxf(global_max, scratch.max[base + p]);
  float total_weight = 0.0f;
  for (int p = 0; p < splits; ++p)
    total_weight += scratch.sum[base + p] * expf(scratch.max[base + p] - global_max);
  bf16* dst = out + (size_t(seq) * num_heads + head) * head_dim;
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float acc = 0.0f;
    for (int p = 0; p < splits; ++p)
      acc += scratch.out[(base + p) * head_dim + d] * scratch.sum[base + p] *
             expf(scratch.max[base + p] - global_max);
    dst[d] = __float2bfloat16(acc / total_weight);
  }
}

}  // namespace

bool attention_supports(int num_heads, int num_kv_heads, int head_dim, std::string* why) {
  auto fail = [&](const std::string& reason) {
    if (why) *why = reason;
    return false;
  };
  if (num_kv_heads <= 0 || num_heads % num_kv_heads != 0)
    return fail("num_attention_heads " + std::to_string(num_heads) +
                " is not a multiple of num_key_value_heads " + std::to_string(num_kv_heads));
  const int group = num_heads / num_kv_heads;
  if (head_dim % 8 != 0 || head_dim > kMaxHeadDim)
    return fail("head_dim " + std::to_string(head_dim) +
                " is not a multiple of 8 up to 256, as the CUDA attention kernels need");
  if (group > kMaxGroup || group * head_dim > kMaxGroupDims)
    return fail(std::to_string(group) + " query heads per KV head of head_dim " +
                std::to_string(head_dim) + " exceed the CUDA decode kernel's " +
                std::to_string(kMaxGroup) + " heads / " + std::to_string(kMaxGroupDims) +
                " values");
  return true;
}

void paged_decode_attention(const bf16* q, int q_stride, const PagedKv& kv,
                            const int32_t* context_lens, int num_seqs, int num_heads,
                            int max_splits, const DecodeScratch& scratch, bf16* out,
                            cudaStream_t stream) {
  const dim3 grid(max_splits, kv.num_kv_heads, num_seqs);
  decode_partition_kernel<<<grid, kThreads, 0, stream>>>(q, q_stride, kv, context_lens, num_heads,
                                                         max_splits, scratch);
  PIPELINE_CUDA_CHECK_LAUNCH();
  decode_merge_kernel<<<dim3(num_heads, num_seqs), 128, 0, stream>>>(
      context_lens, num_heads, kv.head_dim, max_splits, scratch, out);
  PIPELINE_CUDA_CHECK_LAUNCH();
}

}  // namespace pipeline::cuda
