// Causal attention over ragged packed prompts, flash-attention style: one block takes a tile of
// kPrefillTileQueries queries of one sequence and one head, walks the keys in tiles of kKeys
// read from the paged cache, and keeps a running max, sum and output per query (online
// softmax), so no [queries x keys] matrix is ever stored. Four threads share each query row:
// they split the tile's keys for the scores and the head dimension for the output.
#include <mutex>

#include "kernels/cuda/bf16_vector.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kernels.h"

namespace pipeline::cuda {
namespace {

constexpr int kQueries = kPrefillTileQueries;
constexpr int kKeys = 32;
constexpr int kThreadsPerRow = 4;
constexpr int kThreads = kQueries * kThreadsPerRow;
constexpr int kMaxHeadDim = 256;
constexpr int kKeysPerThread = kKeys / kThreadsPerRow;
constexpr int kDimsPerThread = kMaxHeadDim / kThreadsPerRow;

// Shared memory: Q, K and V tiles as float rows padded by one element (no bank conflicts
// between rows), then the tile's probabilities.
size_t shared_bytes(int head_dim) {
  return sizeof(float) * (size_t(kQueries + 2 * kKeys) * (head_dim + 1) + kQueries * (kKeys + 1));
}

__global__ void __launch_bounds__(kThreads)
    prefill_attention_kernel(const bf16* q, int q_stride, PagedKv kv, const int32_t* tiles,
                             const int32_t* q_offsets, const int32_t* q_lens,
                             const int32_t* start_positions, int num_heads, bf16* out) {
  extern __shared__ float shared[];
  const int D = kv.head_dim;
  const int row_stride = D + 1;
  float* q_s = shared;
  float* k_s = q_s + kQueries * row_stride;
  float* v_s = k_s + kKeys * row_stride;
  float* p_s = v_s + kKeys * row_stride;

  const int seq = tiles[2 * blockIdx.x], first_query = tiles[2 * blockIdx.x + 1];
  const int head = blockIdx.y;
  const int kv_head = head / (num_heads / kv.num_kv_heads);
  const int rows = min(kQueries, q_lens[seq] - first_query);
  const int first_position = start_positions[seq] + first_query;
  const size_t first_token = size_t(q_offsets[seq]) + first_query;
  const float scale = rsqrtf(float(D));

  for (int idx = threadIdx.x; idx < kQueries * D; idx += kThreads) {
    const int r = idx / D, d = idx % D;
    q_s[r * row_stride + d] =
        r < rows ? __bfloat162float(q[(first_token + r) * q_stride + size_t(head) * D + d]) * scale
                 : 0.0f;
  }

  const int row = threadIdx.x / kThreadsPerRow;
  const int sub = threadIdx.x % kThreadsPerRow;
  const bool row_valid = row < rows;
  const int position = first_position + row;
  const int num_keys = first_position + rows;  // causal: keys up to the tile's last query
  const size_t slot_stride = size_t(kv.num_kv_heads) * D;
  const int32_t* table = kv.block_tables + size_t(seq) * kv.max_blocks_per_seq;

  float running_max = -INFINITY, running_sum = 0.0f;
  float acc[kDimsPerThread];
#pragma unroll
  for (int j = 0; j < kDimsPerThread; ++j) acc[j] = 0.0f;

  for (int key0 = 0; key0 < num_keys; key0 += kKeys) {
    __syncthreads();  // the previous tile's K and V are no longer read
    const int vectors_per_row = D / 8;
    for (int idx = threadIdx.x; idx < kKeys * vectors_per_row; idx += kThreads) {
      const int r = idx / vectors_per_row, c = (idx % vectors_per_row) * 8;
      const int key_position = key0 + r;
      uint4 k_raw = make_uint4(0, 0, 0, 0), v_raw = make_uint4(0, 0, 0, 0);
      if (key_position < num_keys) {
        const size_t block = size_t(table[key_position / kv.block_size]);
        const size_t offset = (block * kv.block_size + key_position % kv.block_size) * slot_stride +
                              size_t(kv_head) * D + c;
        k_raw = *reinterpret_cast<const uint4*>(kv.k + offset);
        v_raw = *reinterpret_cast<const uint4*>(kv.v + offset);
      }
      unpack8(k_raw, k_s + r * row_stride + c);
      unpack8(v_raw, v_s + r * row_stride + c);
    }
    __syncthreads();

    // Scores of this thread's keys (sub, sub + 4, ...), masked past the query's own position.
    // Each q element is loaded once for all of the thread's keys.
    float scores[kKeysPerThread];
#pragma unroll
    for (int i = 0; i < kKeysPerThread; ++i) scores[i] = 0.0f;
    for (int d = 0; d < D; ++d) {
      const float q_d = q_s[row * row_stride + d];
#pragma unroll
      for (int i = 0; i < kKeysPerThread; ++i)
        scores[i] += q_d * k_s[(sub + kThreadsPerRow * i) * row_stride + d];
    }
    float tile_max = -INFINITY;
#pragma unroll
    for (int i = 0; i < kKeysPerThread; ++i) {
      const int key = sub + kThreadsPerRow * i;
      if (!row_valid || key0 + key > position) scores[i] = -INFINITY;
      tile_max = fmaxf(tile_max, scores[i]);
    }
    for (int offset = 1; offset < kThreadsPerRow; offset <<= 1)
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, offset));

    const float new_max = fmaxf(running_max, tile_max);
    // A row with no visible key yet (only padding rows past the prompt) keeps everything zero.
    const bool any = new_max != -INFINITY;
    const float correction = any ? expf(running_max - new_max) : 1.0f;
    float tile_sum = 0.0f;
#pragma unroll
    for (int i = 0; i < kKeysPerThread; ++i) {
      const float p = any ? expf(scores[i] - new_max) : 0.0f;
      p_s[row * (kKeys + 1) + sub + kThreadsPerRow * i] = p;
      tile_sum += p;
    }
    for (int offset = 1; offset < kThreadsPerRow; offset <<= 1)
      tile_sum += __shfl_xor_sync(0xffffffffu, tile_sum, offset);
    running_sum = running_sum * correction + tile_sum;
    running_max = new_max;
    __syncwarp();  // the row's four threads (one warp) exchange probabilities through p_s

    // Each probability is loaded once for all of the thread's output columns.
#pragma unroll
    for (int j = 0; j < kDimsPerThread; ++j) acc[j] *= correction;
    for (int key = 0; key < kKeys; ++key) {
      const float p = p_s[row * (kKeys + 1) + key];
#pragma unroll
      for (int j = 0; j < kDimsPerThread; ++j) {
        const int d = sub + kThreadsPerRow * j;
        if (d >= D) break;
        acc[j] += p * v_s[key * row_stride + d];
      }
    }
    __syncwarp();  // p_s is rewritten by the next tile
  }

  if (!row_valid) return;
  bf16* dst = out + (first_token + row) * (size_t(num_heads) * D) + size_t(head) * D;
#pragma unroll
  for (int j = 0; j < kDimsPerThread; ++j) {
    const int d = sub + kThreadsPerRow * j;
    if (d >= D) break;
    dst[d] = __float2bfloat16(acc[j] / running_sum);
  }
}

}  // namespace

void prefill_attention(const bf16* q, int q_stride, const PagedKv& kv, const int32_t* tiles,
                       int num_tiles, const int32_t* q_offsets, const int32_t* q_lens,
                       const int32_t* start_positions, int num_heads, bf16* out,
                       cudaStream_t stream) {
  const size_t shared = shared_bytes(kv.head_dim);
  // The limit is the kernel's own (in this process's one device context): raised once to the
  // largest size asked for, not on every call, each a driver call. Under a lock, so that two
  // threads asking for different sizes cannot leave `allowed` above what the driver was told.
  static std::mutex raising;
  static size_t allowed = 0;
  {
    const std::lock_guard<std::mutex> lock(raising);
    if (shared > allowed) {
      PIPELINE_CUDA_CHECK(cudaFuncSetAttribute(
          prefill_attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared)));
      allowed = shared;
    }
  }
  prefill_attention_kernel<<<dim3(num_tiles, num_heads), kThreads, shared, stream>>>(
      q, q_stride, kv, tiles, q_offsets, q_lens, start_positions, num_heads, out);
  PIPELINE_CUDA_CHECK_LAUNCH();
}

}  // namespace pipeline::cuda
