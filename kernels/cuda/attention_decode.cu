// Paged-attention decode, flash-decoding style: each sequence's cached positions are cut into
// partitions (64, 128 or 256 positions: decode_partition); one block scores one
// partition for all query heads that share a KV head (grouped-query attention reads each K/V row
// once) in a single pass over K and V with an online softmax. A context of one partition writes its
// output at once; otherwise each block keeps a normalised partial output with its max and sum, and
// the last block of the (sequence, KV head) to finish merges them all, in partition order, so the
// result does not depend on which block finished last.
//
// Each kernel also applies the rotary embedding of the step's new token: every block rotates q
// as it loads it, and the block of the last partition, the only one that reads the new
// position, rotates k and appends k and v to the cache first. So a decode layer's attention is
// one kernel: no RoPE/KV-write launch before it, no merge launch after it.
//
// The grid spans `splits` partitions, enough for the batch's longest context, so a captured
// CUDA graph serves every step whose contexts fit; blocks past a sequence's length exit at once.
// Scores are kept in log2 units (q is pre-scaled by log2(e) / sqrt(head_dim)) so every
// exponential is one exp2f.
//
// Two kernels do this, and differ only in how a block's K and V rows reach it
// (DecodeAttentionKernel): the direct one loads a few rows per thread into registers, then
// scores them; the pipelined one copies rows into a ring in shared memory several stages ahead
// of the rows it scores. The runner times both and runs the faster.
#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/bf16_vector.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/kernel_choice.h"
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

// ---- What both kernels share: one block's partition, its shared memory, its start, its
// scoring of rows and its end.

// The partition one block attends: partition `split` of sequence `seq`'s positions, for the
// query heads of KV head kv_head.
struct PartitionWork {
  int split, kv_head, seq;
  int context;      // the sequence's positions, the new one included
  int begin, n;     // the partition's first position and its positions (where begin < context)
  int parts;        // the partitions the sequence's context spans
  bool last_part;   // the only one that holds (and appends) the new token
  int new_row;      // the new token's row in the partition, or -1
  int first_block;  // the index in the block table of the block that holds position begin
};

__device__ __forceinline__ PartitionWork partition_work(const int32_t* context_lens, int partition,
                                                        int block_size) {
  PartitionWork w;
  w.split = blockIdx.x;
  w.kv_head = blockIdx.y;
  w.seq = blockIdx.z;
  w.context = context_lens[w.seq];
  w.begin = w.split * partition;
  w.n = min(partition, w.context - w.begin);
  w.parts = (w.context + partition - 1) / partition;
  w.last_part = w.split == w.parts - 1;
  w.new_row = w.last_part ? w.n - 1 : -1;
  w.first_block = w.begin / block_size;
  return w;
}

// The 16 bytes of K and V rows a thread reads: a row group of row_threads lanes covers a row,
// and the block's rows_per_pass row groups take consecutive rows.
struct RowLanes {
  int row_threads, rows_per_pass;
  int row_in_pass;  // this thread's row group
  int d0;           // the first of this lane's 8 columns
  bool active;      // d0 < head_dim: lanes past the row read nothing and hold zeros

  // This thread's row u of the rows_per_pass * k rows from row `base`.
  __device__ int row(int base, int u) const { return base + u * rows_per_pass + row_in_pass; }
};

__device__ __forceinline__ RowLanes row_lanes(int head_dim) {
  RowLanes r;
  r.row_threads = threads_per_row(head_dim);
  r.rows_per_pass = kThreads / r.row_threads;
  r.row_in_pass = threadIdx.x / r.row_threads;
  r.d0 = threadIdx.x % r.row_threads * 8;
  r.active = r.d0 < head_dim;
  return r;
}

// A block's shared memory, but for the warps' partial sums (WarpSums), which the pipelined
// kernel lays over its copy ring once the ring is spent.
template <int kGroup>
struct PartitionShared {
  float q[kGroup * kMaxHeadDim];  // the group's q, rotated and pre-scaled
  float cos[kMaxHeadDim / 2], sin[kMaxHeadDim / 2];
  int32_t blocks[kLongDecodePartition + 1];  // the cache blocks the partition spans
  float warp_max[kWarps][kGroup], warp_sum[kWarps][kGroup];
  bool last_to_arrive;
};
template <int kGroup>
using WarpSums = float[kWarps][kGroup * kMaxHeadDim];

// The new token's rotary angles, as Hugging Face's LlamaRotaryEmbedding computes them, and the
// block-table entries of the partition, in one round trip. Both are the step's inputs, which no
// kernel writes: read before waiting for the previous kernel.
template <int kGroup>
__device__ __forceinline__ void load_angles_and_blocks(PartitionShared<kGroup>& sh,
                                                       const PartitionWork& w, const PagedKv& kv,
                                                       const DecodeNewTokens& fresh) {
  const int D = kv.head_dim, half = D / 2;
  const float position = float(fresh.positions[w.seq]);
  for (int i = threadIdx.x; i < half; i += kThreads) {
    const float inv_freq = 1.0f / powf(fresh.rope_theta, float(2 * i) / float(D));
    sincosf(position * inv_freq, &sh.sin[i], &sh.cos[i]);
  }
  const int32_t* table = kv.block_tables + size_t(w.seq) * kv.max_blocks_per_seq;
  const int num_blocks = (w.begin + w.n - 1) / kv.block_size - w.first_block + 1;
  for (int b = threadIdx.x; b < num_blocks; b += kThreads) sh.blocks[b] = table[w.first_block + b];
}

// Where this lane's 16 bytes of row i (< n) of the partition are in the K and V pools.
__device__ __forceinline__ size_t row_offset(const int32_t* blocks, const PartitionWork& w,
                                             const PagedKv& kv, const RowLanes& lanes, int i) {
  const int at = w.begin + i;
  const size_t block = size_t(blocks[at / kv.block_size - w.first_block]);
  const size_t slot_stride = size_t(kv.num_kv_heads) * kv.head_dim;
  return (block * kv.block_size + at % kv.block_size) * slot_stride +
         size_t(w.kv_head) * kv.head_dim + lanes.d0;
}

// This lane's 16 bytes of K and V of row i (< n) of the partition, loaded at once.
__device__ __forceinline__ void load_row(const int32_t* blocks, const PartitionWork& w,
                                         const PagedKv& kv, const RowLanes& lanes, int i, uint4& k,
                                         uint4& v) {
  const size_t at = row_offset(blocks, w, kv, lanes, i);
  k = *reinterpret_cast<const uint4*>(kv.k + at);
  v = *reinterpret_cast<const uint4*>(kv.v + at);
}

// q of the group's heads, rotated, rounded to bf16 as rope_write_kv stores a prefill's q (so
// decode and prefill attend with the same q), and pre-scaled (log2 units). The last partition's
// block also appends the new k (rotated) and v, which it then reads back: the barrier after
// this makes a block's global writes visible to its own threads. After the wait for the QKV
// projection.
template <int kGroup>
__device__ __forceinline__ void load_q_and_append_new(PartitionShared<kGroup>& sh,
                                                      const PartitionWork& w, const bf16* qkv,
                                                      int qkv_stride, const PagedKv& kv,
                                                      const DecodeNewTokens& fresh, int num_heads) {
  const int D = kv.head_dim, half = D / 2;
  const int first_head = w.kv_head * kGroup;
  const float scale = kLog2e * rsqrtf(float(D));
  const bf16* q_row = qkv + size_t(w.seq) * qkv_stride + size_t(first_head) * D;
  for (int idx = threadIdx.x; idx < kGroup * D; idx += kThreads)
    sh.q[idx] =
        round_to_bf16(rotated(q_row + (idx / D) * D, idx % D, half, sh.cos, sh.sin)) * scale;
  if (!w.last_part) return;
  const bf16* k_new = qkv + size_t(w.seq) * qkv_stride + size_t(num_heads + w.kv_head) * D;
  const bf16* v_new = k_new + size_t(kv.num_kv_heads) * D;
  const size_t at = (size_t(fresh.slots[w.seq]) * kv.num_kv_heads + w.kv_head) * D;
  for (int d = threadIdx.x; d < D; d += kThreads) {
    fresh.k_cache[at + d] = __float2bfloat16(rotated(k_new, d, half, sh.cos, sh.sin));
    fresh.v_cache[at + d] = v_new[d];
  }
}

// This lane's 8 columns of the group's q (zeros for a lane past the row), and an empty state.
template <int kGroup>
__device__ __forceinline__ void start_scoring(const PartitionShared<kGroup>& sh,
                                              const RowLanes& lanes, int head_dim,
                                              float (&q)[kGroup][8], SoftmaxState<kGroup>& state) {
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
#pragma unroll
    for (int j = 0; j < 8; ++j) q[g][j] = lanes.active ? sh.q[g * head_dim + lanes.d0 + j] : 0.0f;
    state.max[g] = -INFINITY;
    state.sum[g] = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) state.acc[g][j] = 0.0f;
  }
}

// Scores this thread's kRows rows, base + u * rows_per_pass + row_in_pass (rows from n on are
// zeros and weigh nothing), against each head of the group and folds them into the state.
template <int kGroup, int kRows>
__device__ __forceinline__ void attend_rows(SoftmaxState<kGroup>& state,
                                            const float (&q)[kGroup][8],
                                            const uint4 (&k_rows)[kRows],
                                            const uint4 (&v_rows)[kRows], int base,
                                            const RowLanes& lanes, int n) {
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
    float scores[kRows];
    float tile_max = state.max[g];
#pragma unroll
    for (int u = 0; u < kRows; ++u) {
      float k[8];
      unpack8(k_rows[u], k);
      float dot = 0.0f;
#pragma unroll
      for (int j = 0; j < 8; ++j) dot += q[g][j] * k[j];
      // Every lane of the warp takes part; lanes row_threads apart hold other rows.
      for (int offset = lanes.row_threads / 2; offset > 0; offset >>= 1)
        dot += __shfl_xor_sync(0xffffffffu, dot, offset);
      const bool valid = lanes.row(base, u) < n;
      scores[u] = valid ? dot : -INFINITY;
      tile_max = fmaxf(tile_max, scores[u]);
    }
    const float correction = scaled_exp2(state.max[g], tile_max);
    state.sum[g] *= correction;
#pragma unroll
    for (int j = 0; j < 8; ++j) state.acc[g][j] *= correction;
#pragma unroll
    for (int u = 0; u < kRows; ++u) {
      const float p = scaled_exp2(scores[u], tile_max);
      float v[8];
      unpack8(v_rows[u], v);
      state.sum[g] += p;
#pragma unroll
      for (int j = 0; j < 8; ++j) state.acc[g][j] += p * v[j];
    }
    state.max[g] = tile_max;
  }
}

// Merges the block's row groups (lanes row_threads apart hold the same columns), then its warps
// through shared memory, and writes the result: the output itself where the context is one
// partition, else this partition's normalised output with the max and sum that weigh it, after
// which the last block of the (sequence, KV head) to arrive merges all of them.
template <int kGroup>
__device__ __forceinline__ void finish_partition(SoftmaxState<kGroup>& state,
                                                 PartitionShared<kGroup>& sh,
                                                 WarpSums<kGroup>& warp_acc, const PartitionWork& w,
                                                 const RowLanes& lanes, const PagedKv& kv,
                                                 int num_heads, const DecodePartials& partials,
                                                 bf16* out) {
  const int D = kv.head_dim;
  for (int offset = lanes.row_threads; offset < 32; offset <<= 1) merge_state(state, offset);
  const int warp = threadIdx.x / 32;
  if (threadIdx.x % 32 < lanes.row_threads) {
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      if (lanes.d0 == 0) {
        sh.warp_max[warp][g] = state.max[g];
        sh.warp_sum[warp][g] = state.sum[g];
      }
      if (lanes.active)
#pragma unroll
        for (int j = 0; j < 8; ++j) warp_acc[warp][g * D + lanes.d0 + j] = state.acc[g][j];
    }
  }
  __syncthreads();

  // This block's result for query head first_head + g, column d: its normalised output, and
  // the max and sum that weigh it against the other partitions.
  auto block_result = [&](int g, int d, float& max, float& sum) {
    max = -INFINITY;
    for (int v = 0; v < kWarps; ++v) max = fmaxf(max, sh.warp_max[v][g]);
    sum = 0.0f;
    float acc = 0.0f;
    for (int v = 0; v < kWarps; ++v) {
      const float weight = scaled_exp2(sh.warp_max[v][g], max);
      sum += sh.warp_sum[v][g] * weight;
      acc += warp_acc[v][g * D + d] * weight;
    }
    return acc / sum;
  };
  const size_t head_base = size_t(w.seq) * num_heads + size_t(w.kv_head) * kGroup;
  if (w.parts == 1) {  // uniform across the block
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
    const size_t at = (head_base + g) * partials.max_splits + w.split;
    partials.out[at * D + d] = value;
    if (d == 0) {
      partials.max[at] = max;
      partials.sum[at] = sum;
    }
  }
  __threadfence();  // the partials are visible device-wide before this block is counted
  __syncthreads();
  int32_t* arrivals = partials.arrivals + size_t(w.seq) * kv.num_kv_heads + w.kv_head;
  if (threadIdx.x == 0) sh.last_to_arrive = atomicAdd(arrivals, 1) == w.parts - 1;
  __syncthreads();
  if (!sh.last_to_arrive) return;

  __threadfence();
  for (int idx = threadIdx.x; idx < kGroup * D; idx += kThreads)
    merge_partials(partials, head_base + idx / D, w.parts, D, idx % D, out);
  if (threadIdx.x == 0) *arrivals = 0;  // ready for the next call
}

// ---- The direct kernel: each pass loads kUnroll rows per thread into registers, then scores
// them. (Loading the next pass's rows while scoring these takes registers that cost more in
// resident blocks than it gains: on an H200, 108 registers a thread instead of 71, and 11% and
// 18% slower at 16 and 64 sequences than the kernel of 128-position partitions that read
// everything after the wait.)

constexpr int kUnroll = 4;

template <int kGroup>
__global__ void __launch_bounds__(kThreads)
    decode_direct_kernel(const bf16* qkv, int qkv_stride, PagedKv kv, DecodeNewTokens fresh,
                         const int32_t* context_lens, int num_heads, int partition,
                         DecodePartials partials, bf16* out) {
  __shared__ __align__(16) PartitionShared<kGroup> sh;
  __shared__ WarpSums<kGroup> warp_acc;
  const PartitionWork w = partition_work(context_lens, partition, kv.block_size);
  if (w.begin >= w.context) return;  // uniform across the block

  // Until wait_for_previous_kernel(), only what no kernel of this step writes: the step's inputs
  // and the cached K and V of earlier positions. So with programmatic dependent launch the block
  // table, the rotary angles and the first rows are on their way while the QKV projection ahead
  // finishes.
  load_angles_and_blocks(sh, w, kv, fresh);
  __syncthreads();
  const RowLanes lanes = row_lanes(kv.head_dim);
  const int rows_per_iteration = lanes.rows_per_pass * kUnroll;
  // This thread's rows of the pass from row `base` (zeros past the partition), but for row
  // `skip`.
  auto load_rows = [&](int base, int skip, uint4(&k)[kUnroll], uint4(&v)[kUnroll]) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = lanes.row(base, u);
      k[u] = v[u] = make_uint4(0, 0, 0, 0);
      if (i < w.n && i != skip && lanes.active) load_row(sh.blocks, w, kv, lanes, i, k[u], v[u]);
    }
  };
  uint4 k[kUnroll], v[kUnroll];
  load_rows(0, w.new_row, k, v);

  wait_for_previous_kernel();
  allow_next_kernel();
  load_q_and_append_new(sh, w, qkv, qkv_stride, kv, fresh, num_heads);
  __syncthreads();
  // The new row, where the first pass holds it, is read now that it is written.
#pragma unroll
  for (int u = 0; u < kUnroll; ++u)
    if (lanes.row(0, u) == w.new_row && lanes.active)
      load_row(sh.blocks, w, kv, lanes, w.new_row, k[u], v[u]);

  float q[kGroup][8];
  SoftmaxState<kGroup> state;
  start_scoring(sh, lanes, kv.head_dim, q, state);
  for (int base = 0; base < w.n; base += rows_per_iteration) {
    if (base != 0) load_rows(base, -1, k, v);
    attend_rows<kGroup, kUnroll>(state, q, k, v, base, lanes, w.n);
  }
  finish_partition<kGroup>(state, sh, warp_acc, w, lanes, kv, num_heads, partials, out);
}

// ---- The pipelined kernel: each thread copies its rows into a ring of kStages slots in shared
// memory (cp.async), kStages - 1 stages ahead of the one it scores, so a block keeps bytes in
// flight all along without holding them in registers. Each thread reads back only what it
// copied itself, so the stages need no barrier, only the wait for the thread's own copies.

constexpr int kStages = 4;
constexpr int kStageRows = 2;  // rows a thread copies per stage
// [slot][K, V][row][thread], 16 bytes each: a warp's pieces of one row are 512 contiguous bytes.
constexpr size_t kRingBytes = size_t(kStages) * 2 * kStageRows * kThreads * sizeof(uint4);

template <int kGroup>
__global__ void __launch_bounds__(kThreads)
    decode_pipelined_kernel(const bf16* qkv, int qkv_stride, PagedKv kv, DecodeNewTokens fresh,
                            const int32_t* context_lens, int num_heads, int partition,
                            DecodePartials partials, bf16* out) {
  constexpr size_t kSumsBytes = sizeof(WarpSums<kGroup>);
  __shared__ __align__(16) PartitionShared<kGroup> sh;
  // The ring, and after the last stage the warps' sums.
  __shared__ __align__(16) unsigned char ring_s[kRingBytes > kSumsBytes ? kRingBytes : kSumsBytes];
  const PartitionWork w = partition_work(context_lens, partition, kv.block_size);
  if (w.begin >= w.context) return;  // uniform across the block

  load_angles_and_blocks(sh, w, kv, fresh);
  __syncthreads();
  const RowLanes lanes = row_lanes(kv.head_dim);
  const int rows_per_stage = lanes.rows_per_pass * kStageRows;
  const int stages = (w.n + rows_per_stage - 1) / rows_per_stage;
  uint4* ring = reinterpret_cast<uint4*>(ring_s);
  // This thread's piece of K (kv 0) or V (1) of its row u of a stage.
  auto piece = [&](int stage, int kv_index, int u) {
    return ring + ((stage % kStages * 2 + kv_index) * kStageRows + u) * kThreads + threadIdx.x;
  };
  auto row_of = [&](int stage, int u) { return lanes.row(stage * rows_per_stage, u); };
  // Copies this thread's rows of a stage (zeros past the partition), but, before the new row
  // is appended, that row: its piece stays untouched until it is read directly below.
  auto copy_stage = [&](int stage, bool before_append) {
#pragma unroll
    for (int u = 0; u < kStageRows; ++u) {
      const int i = row_of(stage, u);
      const bool valid = i < w.n && lanes.active;
      if (before_append && valid && i == w.new_row) continue;
      const size_t at = valid ? row_offset(sh.blocks, w, kv, lanes, i) : 0;
      copy_16_async(piece(stage, 0, u), kv.k + at, valid);
      copy_16_async(piece(stage, 1, u), kv.v + at, valid);
    }
  };
  // The first kStages - 1 stages before the wait for the previous kernel: cached rows only.
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < stages) copy_stage(s, true);
    commit_async_copies();  // one group per stage, empty or not, so the waits below count right
  }

  wait_for_previous_kernel();
  allow_next_kernel();
  load_q_and_append_new(sh, w, qkv, qkv_stride, kv, fresh, num_heads);
  __syncthreads();
  // The new row, where a stage copied before the append holds its place, read now it is written.
  if (w.new_row >= 0 && w.new_row / rows_per_stage < kStages - 1 && lanes.active) {
    const int stage = w.new_row / rows_per_stage;
#pragma unroll
    for (int u = 0; u < kStageRows; ++u)
      if (row_of(stage, u) == w.new_row)
        load_row(sh.blocks, w, kv, lanes, w.new_row, *piece(stage, 0, u), *piece(stage, 1, u));
  }

  float q[kGroup][8];
  SoftmaxState<kGroup> state;
  start_scoring(sh, lanes, kv.head_dim, q, state);
  for (int s = 0; s < stages; ++s) {
    // Into the slot stage s - 1 left: this thread read it back in the previous iteration.
    if (s + kStages - 1 < stages) copy_stage(s + kStages - 1, false);
    commit_async_copies();
    wait_async_copies<kStages - 1>();  // stage s has landed
    uint4 k[kStageRows], v[kStageRows];
#pragma unroll
    for (int u = 0; u < kStageRows; ++u) {
      k[u] = *piece(s, 0, u);
      v[u] = *piece(s, 1, u);
    }
    attend_rows<kGroup, kStageRows>(state, q, k, v, s * rows_per_stage, lanes, w.n);
  }
  wait_async_copies<0>();
  __syncthreads();  // every thread is done with the ring before it takes the warps' sums
  finish_partition<kGroup>(state, sh, *reinterpret_cast<WarpSums<kGroup>*>(ring_s), w, lanes, kv,
                           num_heads, partials, out);
}

using PartitionKernel = void (*)(const bf16*, int, PagedKv, DecodeNewTokens, const int32_t*, int,
                                 int, DecodePartials, bf16*);

template <int kGroup>
PartitionKernel partition_kernel(DecodeAttentionKernel kernel) {
  return kernel == DecodeAttentionKernel::pipelined ? decode_pipelined_kernel<kGroup>
                                                    : decode_direct_kernel<kGroup>;
}

// The kernel built for `group` query heads per KV head.
PartitionKernel partition_kernel_for(int group, DecodeAttentionKernel kernel) {
  switch (group) {
    case 1:
      return partition_kernel<1>(kernel);
    case 2:
      return partition_kernel<2>(kernel);
    case 4:
      return partition_kernel<4>(kernel);
    case 8:
      return partition_kernel<8>(kernel);
  }
  throw std::invalid_argument("paged_decode_attention: " + std::to_string(group) +
                              " query heads per KV head is not 1, 2, 4 or 8");
}

}  // namespace

const char* decode_attention_kernel_name(DecodeAttentionKernel kernel) {
  return kernel == DecodeAttentionKernel::pipelined ? "pipelined" : "direct";
}

DecodeAttentionKernel decode_attention_kernel_named(const std::string& name) {
  return kernel_named(kDecodeAttentionKernels, decode_attention_kernel_name,
                      "decode attention kernel", name);
}

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
                            int num_heads, int partition, int splits, DecodeAttentionKernel kernel,
                            const DecodeScratch& scratch, bf16* out, cudaStream_t stream) {
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
  launch_dependent(partition_kernel_for(num_heads / kv.num_kv_heads, kernel), grid, kThreads, 0,
                   stream, qkv, qkv_stride, kv, fresh, context_lens, num_heads, partition,
                   scratch.partials(), out);
}

}  // namespace pipeline::cuda
