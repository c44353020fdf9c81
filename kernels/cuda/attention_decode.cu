// Paged-attention decode, flash-decoding style: each sequence's cached positions are cut into
// partitions (64, 128 or 256 positions: decode_partition); one block scores one
// partition for all query heads that share a KV head (grouped-query attention reads each K/V row
// once) in a single pass over K and V with an online softmax. A context of one partition writes its
// output at once; otherwise each block keeps a normalised partial output with its max and sum, and
// the last block of the (sequence, KV head) to finish merges them all, in partition order, so the
// result does not depend on which block finished last.
//
// The kernel also applies the rotary embedding of the step's new token: every block rotates q
// as it loads it, and the block of the last partition, the only one that reads the new
// position, rotates k and appends k and v to the cache first. So a decode layer's attention is
// one kernel: no RoPE/KV-write launch before it, no merge launch after it.
//
// The grid spans `splits` partitions, enough for the batch's longest context, so a captured
// CUDA graph serves every step whose contexts fit; blocks past a sequence's length exit at once.
// Scores are kept in log2 units (q is pre-scaled by log2(e) / sqrt(head_dim)) so every
// exponential is one exp2f.
#include "kernels/cuda/bf16_vector.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/kernels.h"

namespace pipeline::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxGroup = 8;  // query heads per KV head
constexpr int kMaxHeadDim = 256;
constexpr float kLog2e = 1.4426950408889634f;

// The lanes that cover one cached row of head_dim bf16 with one 16-byte load each (a power of
// two, at most 32): a row group.
__device__ __forceinline__ int threads_per_row(int head_dim) {
  int t = 1;
  while (t * 8 < head_dim) t <<= 1;
  return t;
}

// exp2(x - max) for a softmax term whose running max may still be -inf (nothing seen yet).
__device__ __forceinline__ float scaled_exp2(float x, float max) {
  return x == -INFINITY ? 0.0f : exp2f(x - max);
}

// The online-softmax state of some rows for one query head and this lane's 8 output columns.
template <int kGroup>
struct SoftmaxState {
  float max[kGroup];
  float sum[kGroup];
  float acc[kGroup][8];
};

// Folds `other` (another thread's state for the same heads and columns) into `s`.
template <int kGroup>
__device__ __forceinline__ void merge_state(SoftmaxState<kGroup>& s, int offset) {
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
    const float other_max = __shfl_xor_sync(0xffffffffu, s.max[g], offset);
    const float other_sum = __shfl_xor_sync(0xffffffffu, s.sum[g], offset);
    const float m = fmaxf(s.max[g], other_max);
    const float mine = scaled_exp2(s.max[g], m), theirs = scaled_exp2(other_max, m);
    s.sum[g] = s.sum[g] * mine + other_sum * theirs;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float other_acc = __shfl_xor_sync(0xffffffffu, s.acc[g][j], offset);
      s.acc[g][j] = s.acc[g][j] * mine + other_acc * theirs;
    }
    s.max[g] = m;
  }
}

// out[head] = sum_p w_p * out_p / sum_p w_p over the `parts` partials of one head, with
// w_p = sum_p * 2^(max_p - M) (maxes in log2 units). The partials were written by other blocks:
// read past L1.
__device__ __forceinline__ void merge_partials(const DecodePartials& partials, size_t head,
                                               int parts, int head_dim, int d, bf16* out) {
  const size_t base = head * partials.max_splits;
  float global_max = -INFINITY;
  for (int p = 0; p < parts; ++p) global_max = fmaxf(global_max, __ldcg(partials.max + base + p));
  float total_weight = 0.0f, acc = 0.0f;
  for (int p = 0; p < parts; ++p) {
    const float weight =
        __ldcg(partials.sum + base + p) * exp2f(__ldcg(partials.max + base + p) - global_max);
    total_weight += weight;
    acc += __ldcg(partials.out + (base + p) * head_dim + d) * weight;
  }
  out[head * head_dim + d] = __float2bfloat16(acc / total_weight);
}

// Element d of a head whose values are at `head` (bf16), rotated by the angles in cos_s/sin_s
// the rotate-half way: d < half pairs with d + half, d >= half with d - half.
__device__ __forceinline__ float rotated(const bf16* head, int d, int half, const float* cos_s,
                                         const float* sin_s) {
  const int i = d < half ? d : d - half;
  const float x = __bfloat162float(head[d]);
  const float partner = __bfloat162float(head[d < half ? d + half : d - half]);
  return d < half ? x * cos_s[i] - partner * sin_s[i] : x * cos_s[i] + partner * sin_s[i];
}

constexpr int kUnroll = 4;  // K/V rows each thread has in flight before using them

// K and V of the rows one pass of the loop below reads: each thread's kUnroll rows (a row group
// of row_threads lanes takes rows row_in_pass, + rows_per_pass, ...), 16 bytes of each.
struct KvRows {
  uint4 k[kUnroll], v[kUnroll];
};

template <int kGroup>
__global__ void __launch_bounds__(kThreads)
    decode_partition_kernel(const bf16* qkv, int qkv_stride, PagedKv kv, DecodeNewTokens fresh,
                            const int32_t* context_lens, int num_heads, int partition,
                            DecodePartials partials, bf16* out) {
  __shared__ __align__(16) float q_s[kGroup * kMaxHeadDim];
  __shared__ float cos_s[kMaxHeadDim / 2], sin_s[kMaxHeadDim / 2];
  __shared__ bool last_to_arrive;
  __shared__ int32_t blocks_s[kLongDecodePartition + 1];  // the cache blocks the partition spans
  __shared__ float warp_max_s[kWarps][kGroup], warp_sum_s[kWarps][kGroup];
  __shared__ float warp_acc_s[kWarps][kGroup * kMaxHeadDim];

  // Until wait_for_previous_kernel(), only what no kernel of this step writes: the step's
  // inputs (uploaded before its first kernel), and the cached K and V of earlier positions. So
  // with programmatic dependent launch the block table, the rotary angles and the first rows
  // are on their way while the QKV projection ahead finishes.
  const int split = blockIdx.x, kv_head = blockIdx.y, seq = blockIdx.z;
  const int context = context_lens[seq];
  const int begin = split * partition;
  if (begin >= context) return;  // uniform across the block
  const int n = min(partition, context - begin);
  const int parts = (context + partition - 1) / partition;
  const bool last_part = split == parts - 1;
  // The row of the step's new token, which this block appends only once q, k, v are ready.
  const int new_row = last_part ? n - 1 : -1;

  const int D = kv.head_dim, half = D / 2;
  const int first_head = kv_head * kGroup;
  // The new token's rotary angles, as Hugging Face's LlamaRotaryEmbedding computes them, and
  // the block-table entries of the partition, in one round trip.
  const float position = float(fresh.positions[seq]);
  for (int i = threadIdx.x; i < half; i += kThreads) {
    const float inv_freq = 1.0f / powf(fresh.rope_theta, float(2 * i) / float(D));
    sincosf(position * inv_freq, &sin_s[i], &cos_s[i]);
  }
  const int32_t* table = kv.block_tables + size_t(seq) * kv.max_blocks_per_seq;
  const int first_block = begin / kv.block_size;
  const int num_blocks = (begin + n - 1) / kv.block_size - first_block + 1;
  for (int b = threadIdx.x; b < num_blocks; b += kThreads) blocks_s[b] = table[first_block + b];
  __syncthreads();

  const int row_threads = threads_per_row(D);
  const int rows_per_pass = kThreads / row_threads;
  const int rows_per_iteration = rows_per_pass * kUnroll;
  const int row_in_pass = threadIdx.x / row_threads;
  const int lane = threadIdx.x % row_threads;
  const int d0 = lane * 8;
  const bool lane_active = d0 < D;
  const size_t slot_stride = size_t(kv.num_kv_heads) * D;
  // This lane's 16 bytes of K and V of row i (< n) of the partition.
  auto load_row = [&](int i, uint4& k, uint4& v) {
    const int at = begin + i;
    const size_t block = size_t(blocks_s[at / kv.block_size - first_block]);
    const size_t offset =
        (block * kv.block_size + at % kv.block_size) * slot_stride + size_t(kv_head) * D + d0;
    k = *reinterpret_cast<const uint4*>(kv.k + offset);
    v = *reinterpret_cast<const uint4*>(kv.v + offset);
  };
  // This thread's rows of the pass from row `base` (zeros past the partition), but for row
  // `skip`.
  auto load_rows = [&](int base, int skip, KvRows& rows) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = base + u * rows_per_pass + row_in_pass;
      rows.k[u] = rows.v[u] = make_uint4(0, 0, 0, 0);
      if (i < n && i != skip && lane_active) load_row(i, rows.k[u], rows.v[u]);
    }
  };
  KvRows current;
  load_rows(0, new_row, current);

  wait_for_previous_kernel();
  allow_next_kernel();

  // q of the group's heads, rotated, rounded to bf16 as rope_write_kv stores a prefill's q (so
  // decode and prefill attend with the same q), and pre-scaled (log2 units). The last partition's
  // block also appends the new k (rotated) and v, which its loop below then reads back: a barrier
  // makes a block's global writes visible to its own threads.
  const float scale = kLog2e * rsqrtf(float(D));
  const bf16* q_row = qkv + size_t(seq) * qkv_stride + size_t(first_head) * D;
  for (int idx = threadIdx.x; idx < kGroup * D; idx += kThreads)
    q_s[idx] = round_to_bf16(rotated(q_row + (idx / D) * D, idx % D, half, cos_s, sin_s)) * scale;
  if (last_part) {
    const bf16* k_new = qkv + size_t(seq) * qkv_stride + size_t(num_heads + kv_head) * D;
    const bf16* v_new = k_new + size_t(kv.num_kv_heads) * D;
    const size_t at = (size_t(fresh.slots[seq]) * kv.num_kv_heads + kv_head) * D;
    for (int d = threadIdx.x; d < D; d += kThreads) {
      fresh.k_cache[at + d] = __float2bfloat16(rotated(k_new, d, half, cos_s, sin_s));
      fresh.v_cache[at + d] = v_new[d];
    }
  }
  __syncthreads();
  // The new row, where the first pass holds it, is read now that it is written.
#pragma unroll
  for (int u = 0; u < kUnroll; ++u)
    if (u * rows_per_pass + row_in_pass == new_row && lane_active)
      load_row(new_row, current.k[u], current.v[u]);

  float q_r[kGroup][8];
#pragma unroll
  for (int g = 0; g < kGroup; ++g)
#pragma unroll
    for (int j = 0; j < 8; ++j) q_r[g][j] = lane_active ? q_s[g * D + d0 + j] : 0.0f;

  SoftmaxState<kGroup> state;
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
    state.max[g] = -INFINITY;
    state.sum[g] = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) state.acc[g][j] = 0.0f;
  }

  // Each pass loads kUnroll rows per thread before it scores any. (Loading the next pass's rows
  // while scoring these takes registers that cost more in resident blocks than it gains: on an
  // H200, 108 registers a thread instead of 71, and 11% and 18% slower at 16 and 64 sequences
  // than the kernel of 128-position partitions that read everything after the wait.)
  for (int base = 0; base < n; base += rows_per_iteration) {
    if (base != 0) load_rows(base, -1, current);
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      float scores[kUnroll];
      float tile_max = state.max[g];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        float k[8];
        unpack8(current.k[u], k);
        float dot = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; ++j) dot += q_r[g][j] * k[j];
        // Every lane of the warp takes part; lanes row_threads apart hold other rows.
        for (int offset = row_threads / 2; offset > 0; offset >>= 1)
          dot += __shfl_xor_sync(0xffffffffu, dot, offset);
        const bool valid = base + u * rows_per_pass + row_in_pass < n;
        scores[u] = valid ? dot : -INFINITY;
        tile_max = fmaxf(tile_max, scores[u]);
      }
      const float correction = scaled_exp2(state.max[g], tile_max);
      state.sum[g] *= correction;
#pragma unroll
      for (int j = 0; j < 8; ++j) state.acc[g][j] *= correction;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const float p = scaled_exp2(scores[u], tile_max);
        float v[8];
        unpack8(current.v[u], v);
        state.sum[g] += p;
#pragma unroll
        for (int j = 0; j < 8; ++j) state.acc[g][j] += p * v[j];
      }
      state.max[g] = tile_max;
    }
  }

  // Merge the row groups of each warp (lanes row_threads apart hold the same columns), then
  // the warps through shared memory.
  for (int offset = row_threads; offset < 32; offset <<= 1) merge_state(state, offset);
  const int warp = threadIdx.x / 32;
  if (threadIdx.x % 32 < row_threads) {
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      if (lane == 0) {
        warp_max_s[warp][g] = state.max[g];
        warp_sum_s[warp][g] = state.sum[g];
      }
      if (lane_active)
#pragma unroll
        for (int j = 0; j < 8; ++j) warp_acc_s[warp][g * D + d0 + j] = state.acc[g][j];
    }
  }
  __syncthreads();

  // This block's result for query head first_head + g, column d: its normalised output, and
  // the max and sum that weigh it against the other partitions.
  auto block_result = [&](int g, int d, float& max, float& sum) {
    max = -INFINITY;
    for (int w = 0; w < kWarps; ++w) max = fmaxf(max, warp_max_s[w][g]);
    sum = 0.0f;
    float acc = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      const float weight = scaled_exp2(warp_max_s[w][g], max);
      sum += warp_sum_s[w][g] * weight;
      acc += warp_acc_s[w][g * D + d] * weight;
    }
    return acc / sum;
  };
  const size_t head_base = size_t(seq) * num_heads + first_head;
  if (parts == 1) {  // uniform across the block
    for (int idx = threadIdx.x; idx < kGroup * D; idx += kThreads) {
      float max, sum;
      out[head_base * D + idx] = __float2bfloat16(block_result(idx / D, idx % D, max, sum));
    }
    return;
  }

  for (int idx = threadIdx.x; idx < kGroup * D; idx += kThreads) {
    const int g = idx / D, d = idx % D;
    float max, sum;
    const float value = block_result(g, d, max, sum);
    const size_t at = (head_base + g) * partials.max_splits + split;
    partials.out[at * D + d] = value;
    if (d == 0) {
      partials.max[at] = max;
      partials.sum[at] = sum;
    }
  }
  __threadfence();  // the partials are visible device-wide before this block is counted
  __syncthreads();
  int32_t* arrivals = partials.arrivals + size_t(seq) * kv.num_kv_heads + kv_head;
  if (threadIdx.x == 0) last_to_arrive = atomicAdd(arrivals, 1) == parts - 1;
  __syncthreads();
  if (!last_to_arrive) return;

  __threadfence();
  for (int idx = threadIdx.x; idx < kGroup * D; idx += kThreads)
    merge_partials(partials, head_base + idx / D, parts, D, idx % D, out);
  if (threadIdx.x == 0) *arrivals = 0;  // ready for the next call
}

using PartitionKernel = void (*)(const bf16*, int, PagedKv, DecodeNewTokens, const int32_t*, int,
                                 int, DecodePartials, bf16*);

// The partition kernel built for `group` query heads per KV head.
PartitionKernel partition_kernel_for(int group) {
  switch (group) {
    case 1:
      return decode_partition_kernel<1>;
    case 2:
      return decode_partition_kernel<2>;
    case 4:
      return decode_partition_kernel<4>;
    case 8:
      return decode_partition_kernel<8>;
  }
  throw std::invalid_argument("paged_decode_attention: " + std::to_string(group) +
                              " query heads per KV head is not 1, 2, 4 or 8");
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
  if (group != 1 && group != 2 && group != 4 && group != kMaxGroup)
    return fail(std::to_string(group) +
                " query heads per KV head; the CUDA decode kernel is built for 1, 2, 4 or 8");
  return true;
}

int decode_partition(int num_seqs, int num_kv_heads, int max_context, int multiprocessors,
                     int max_splits) {
  auto splits = [&](int partition) { return int64_t(max_context + partition - 1) / partition; };
  for (int partition : {kLongDecodePartition, kDecodePartition}) {
    const int64_t blocks = int64_t(num_seqs) * num_kv_heads * splits(partition);
    if (blocks >= int64_t(kDecodeBlocksPerSm) * multiprocessors) return partition;
  }
  return splits(kShortDecodePartition) <= max_splits ? kShortDecodePartition : kDecodePartition;
}

DecodeScratch::DecodeScratch(int seqs, int num_heads, int num_kv_heads, int head_dim,
                             int max_splits, cudaStream_t stream)
    : seqs_(seqs) {
  const size_t partitions = size_t(seqs) * num_heads * max_splits;
  out_ = DeviceBuffer<float>(partitions * head_dim);
  max_ = DeviceBuffer<float>(partitions);
  sum_ = DeviceBuffer<float>(partitions);
  arrivals_ = DeviceBuffer<int32_t>(size_t(seqs) * num_kv_heads);
  PIPELINE_CUDA_CHECK(cudaMemsetAsync(arrivals_.data(), 0, arrivals_.bytes(), stream));
  partials_ = {out_.data(), max_.data(), sum_.data(), arrivals_.data(), max_splits};
}

void paged_decode_attention(const bf16* qkv, int qkv_stride, const PagedKv& kv,
                            const DecodeNewTokens& fresh, const int32_t* context_lens, int num_seqs,
                            int num_heads, int partition, int splits, const DecodeScratch& scratch,
                            bf16* out, cudaStream_t stream) {
  if (partition != kShortDecodePartition && partition != kDecodePartition &&
      partition != kLongDecodePartition)
    throw std::invalid_argument("paged_decode_attention: partitions of " +
                                std::to_string(partition) + " positions, not 64, 128 or 256");
  if (splits > scratch.partials().max_splits)
    throw std::invalid_argument("paged_decode_attention: " + std::to_string(splits) +
                                " partitions, the scratch holds " +
                                std::to_string(scratch.partials().max_splits));
  // A sequence past the scratch would share another's arrival count and partials.
  if (num_seqs > scratch.seqs())
    throw std::invalid_argument("paged_decode_attention: " + std::to_string(num_seqs) +
                                " sequences, the scratch holds " + std::to_string(scratch.seqs()));
  const dim3 grid(splits, kv.num_kv_heads, num_seqs);
  launch_dependent(partition_kernel_for(num_heads / kv.num_kv_heads), grid, kThreads, 0, stream,
                   qkv, qkv_stride, kv, fresh, context_lens, num_heads, partition,
                   scratch.partials(), out);
}

}  // namespace pipeline::cuda
