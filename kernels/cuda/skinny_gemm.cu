// y = x . W^T for a few rows on tensor cores. A decode step of 2..64 sequences reads every
// weight once and does 2..64 multiply-adds with it: the product is bound by the weight stream,
// but too many flops for CUDA cores past a few rows. cuBLAS tiles it as a large GEMM and streams
// 4096-column projections at half the device's bandwidth; this kernel is built to stream.
//
// Each warp owns 16 weight rows (output columns) and walks the k axis 32 at a time: lane
// (g = lane / 4, t = lane % 4) loads k = 8t .. 8t + 7 of weight rows g and g + 8 and of x rows
// g, g + 8, ... in one 16-byte load each, and the 32 values are two mma.sync m16n8k16 per 8 rows
// of x, weights as the 16-row A operand and x as the B operand. A dot product may visit k in
// any order as long as A and B agree, so the first mma takes elements 8t .. 8t + 3 of every
// lane's loads and the second 8t + 4 .. 8t + 7, whatever k the fragment layout calls them.
//
// A block's eight warps take consecutive 16-row groups over the same k range, so x comes from
// L2 once per block and from L1 after that: at 64 rows, four bytes of x from L1 for every byte
// of weights from memory. When the weight rows make too few blocks to fill the device, the k
// axis is split across blocks (and further where Gemm::tune() times more splits faster): each
// writes float32 partials, and the last block of a column tile to arrive sums them in split
// order (so results do not depend on timing) and writes y.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/cuda/bf16_vector.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_objects.h"
#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/silu.cuh"
#include "kernels/cuda/skinny_gemm.h"

namespace pipeline::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kTileColumns = 16 * kWarps;  // weight rows (output columns) of one block
constexpr int kChunk = 32;                 // k per warp per 16-byte load
constexpr int kMinSplitLength = 256;       // k a split walks at least
constexpr int kMaxSplits = 8;
constexpr int kBlocksPerSm = 2;
// A split call's blocks are at most this many waves of resident blocks: the partials' bound.
constexpr int kMaxSplitWaves = 4;

// d += a . b on one m16n8k16 tile: a 16x16 bf16 (4 registers of two), b 16x8 bf16 (2), d 16x8
// float32 (4), in the fragment layout of the PTX ISA.
__device__ __forceinline__ void mma_16x8x16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                            uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint4 load_or_zero(const bf16* p, bool valid) {
  return valid ? __ldg(reinterpret_cast<const uint4*>(p)) : make_uint4(0, 0, 0, 0);
}

// Weights are read once per call: streamed past the caches (evict-first).
__device__ __forceinline__ uint4 stream_or_zero(const bf16* p, bool valid) {
  return valid ? __ldcs(reinterpret_cast<const uint4*>(p)) : make_uint4(0, 0, 0, 0);
}

// Grid (column tile, split). kTiles n-tiles of 8 x rows: rows <= 8 * kTiles. Each split walks
// k_slice values of k (a multiple of kChunk); splits past `in` contribute zeros. With kSiluMul
// the `out` columns are interleaved (gate, up) pairs and y [rows, out / 2] gets silu(gate) * up.
template <int kTiles, typename Out, bool kSiluMul>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    skinny_gemm_kernel(const bf16* __restrict__ x, const bf16* __restrict__ w, Out* __restrict__ y,
                       int rows, int in, int out, int k_slice, float* __restrict__ partials,
                       int32_t* __restrict__ arrivals) {
  __shared__ bool last_to_arrive;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int tile = blockIdx.x, split = blockIdx.y, splits = gridDim.y;
  const int column_a = tile * kTileColumns + warp * 16 + g;  // this lane's weight rows
  const int column_b = column_a + 8;
  const int k_begin = split * k_slice;
  const int k_end = min(in, k_begin + k_slice);
  const bf16* w_a = w + size_t(column_a) * in + 8 * t;
  const bf16* w_b = w + size_t(column_b) * in + 8 * t;
  const bf16* x_lane = x + size_t(g) * in + 8 * t;

  // Chunks of weights each lane has in flight: 4, or 2 where 8 n-tiles of accumulators and x
  // leave no registers for more.
  constexpr int kUnroll = kTiles <= 4 ? 4 : 2;
  // The pass of kUnroll chunks from k0; `in` and k_end are multiples of 8.
  auto in_k = [&](int k0, int u) { return k0 + kChunk * u + 8 * t < k_end; };
  uint4 wa[kUnroll], wb[kUnroll];
  auto load_weights = [&](int k0) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int k = k0 + kChunk * u;
      wa[u] = stream_or_zero(w_a + k, in_k(k0, u) && column_a < out);
      wb[u] = stream_or_zero(w_b + k, in_k(k0, u) && column_b < out);
    }
  };
  // No kernel writes the weights, so the first pass's loads go out before waiting for the
  // kernel ahead: with programmatic dependent launch they overlap its last blocks.
  load_weights(k_begin);
  wait_for_previous_kernel();
  allow_next_kernel();

  float acc[kTiles][4] = {};
  // Every lane runs the same iterations: mma.sync needs the whole warp. x is loaded one chunk
  // at a time (it comes from L1 or L2, and 64 rows of it for every chunk in flight would not
  // fit in registers beside the weights); the compiler hoists what the registers allow.
  for (int k0 = k_begin; k0 < k_end; k0 += kChunk * kUnroll) {
    if (k0 != k_begin) load_weights(k0);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      uint4 xv[kTiles];
#pragma unroll
      for (int j = 0; j < kTiles; ++j)
        xv[j] = load_or_zero(x_lane + size_t(8 * j) * in + k0 + kChunk * u,
                             in_k(k0, u) && g + 8 * j < rows);
#pragma unroll
      for (int j = 0; j < kTiles; ++j) {
        mma_16x8x16(acc[j], wa[u].x, wb[u].x, wa[u].y, wb[u].y, xv[j].x, xv[j].y);
        mma_16x8x16(acc[j], wa[u].z, wb[u].z, wa[u].w, wb[u].w, xv[j].z, xv[j].w);
      }
    }
  }

  // acc[j][e] is output column (e < 2 ? column_a : column_b), x row 8j + 2t + (e & 1).
  auto for_each_result = [&](auto&& visit) {
#pragma unroll
    for (int j = 0; j < kTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int column = e < 2 ? column_a : column_b;
        const int row = 8 * j + 2 * t + (e & 1);
        if (column < out && row < rows) visit(size_t(row) * out + column, acc[j][e]);
      }
  };
  if (splits == 1 && kSiluMul) {
    // Output column 2m (gate) is in a lane of even g; its up column 2m + 1 is in the lane four
    // on (g + 1, the same t), for the same x rows.
#pragma unroll
    for (int j = 0; j < kTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float up = __shfl_down_sync(0xffffffffu, acc[j][e], 4);
        const int column = e < 2 ? column_a : column_b;
        const int row = 8 * j + 2 * t + (e & 1);
        if (g % 2 == 0 && column < out && row < rows)
          store_value(y + size_t(row) * (out / 2) + column / 2, silu_mul_epilogue(acc[j][e], up));
      }
    return;
  }
  if (splits == 1) {
    for_each_result([&](size_t at, float v) { store_value(y + at, v); });
    return;
  }

  float* mine = partials + size_t(split) * rows * out;
  for_each_result([&](size_t at, float v) { mine[at] = v; });
  __threadfence();  // the partials are visible device-wide before this block is counted
  __syncthreads();
  if (threadIdx.x == 0) last_to_arrive = atomicAdd(arrivals + tile, 1) == splits - 1;
  __syncthreads();
  if (!last_to_arrive) return;

  __threadfence();
  // Each thread sums kPerThread elements kThreads apart (a warp's 32 lanes take 32 consecutive
  // columns of one row), kSumGroup at a time with all their splits' loads in flight before the
  // first add: this block's reduction is the call's tail, which the rest of the device waits
  // out. Splits are added in order, the absent ones as zeros.
  constexpr int kPerThread = 8 * kTiles * kTileColumns / kThreads;
  constexpr int kSumGroup = kPerThread < 4 ? kPerThread : 4;
  const int first_column = tile * kTileColumns;
  const int columns = min(kTileColumns, out - first_column);
  struct Element {
    int row, column;
    bool valid;
  };
  auto element = [&](int e) {
    const int idx = threadIdx.x + e * kThreads;
    const int row = idx / kTileColumns, column = idx % kTileColumns;
    return Element{row, column, row < rows && column < columns};
  };
#pragma unroll
  for (int e0 = 0; e0 < kPerThread; e0 += kSumGroup) {
    float part[kSumGroup][kMaxSplits];
#pragma unroll
    for (int e = 0; e < kSumGroup; ++e) {
      const Element el = element(e0 + e);
      const size_t at = size_t(el.row) * out + first_column + el.column;
#pragma unroll
      for (int s = 0; s < kMaxSplits; ++s)
        part[e][s] = el.valid && s < splits ? __ldcg(partials + size_t(s) * rows * out + at) : 0.0f;
    }
#pragma unroll
    for (int e = 0; e < kSumGroup; ++e) {
      const Element el = element(e0 + e);
      float sum = 0.0f;
#pragma unroll
      for (int s = 0; s < kMaxSplits; ++s) sum += part[e][s];
      if constexpr (kSiluMul) {
        const float up = __shfl_down_sync(0xffffffffu, sum, 1);  // column + 1, in the next lane
        if (el.valid && el.column % 2 == 0)
          store_value(y + size_t(el.row) * (out / 2) + (first_column + el.column) / 2,
                      silu_mul_epilogue(sum, up));
      } else if (el.valid) {
        store_value(y + size_t(el.row) * out + first_column + el.column, sum);
      }
    }
  }
  if (threadIdx.x == 0) arrivals[tile] = 0;  // ready for the next call
}

int tiles_for(int out) {
  return (out + kTileColumns - 1) / kTileColumns;
}

}  // namespace

bool skinny_gemm_applies(int rows, int in) {
  return rows >= 2 && rows <= kSkinnyMaxRows && in % 8 == 0;
}

int skinny_build_rows(int rows) {
  for (int build : kSkinnyBuildRows)
    if (rows <= build) return build;
  return kSkinnyMaxRows;
}

SkinnyGemm::SkinnyGemm(cudaStream_t stream) : stream_(stream) {
  target_blocks_ = kBlocksPerSm * multiprocessor_count();
  // A split call has splits * tiles <= kMaxSplitWaves * target_blocks_ (skinny_split_options), so
  // its partials fit, and at least two splits, so its tiles have counters.
  const size_t max_split_blocks = size_t(kMaxSplitWaves) * target_blocks_;
  partials_ = DeviceBuffer<float>(max_split_blocks * kTileColumns * kSkinnyMaxRows);
  arrivals_ = DeviceBuffer<int32_t>(max_split_blocks / 2);
  // On the stream the kernels run on: cudaMemset's default stream does not order against it.
  PIPELINE_CUDA_CHECK(cudaMemsetAsync(arrivals_.data(), 0, arrivals_.bytes(), stream_));
}

std::vector<int> skinny_split_options(int in, int out, int resident_blocks) {
  const int tiles = tiles_for(out);
  const int most = std::min(kMaxSplits, std::max(1, in / kMinSplitLength));
  // Split k only as far as the column tiles leave the device short of blocks.
  const int fill = std::clamp(resident_blocks / tiles, 1, most);
  std::vector<int> options{fill};
  for (int splits = 2 * fill; splits <= most && tiles * splits <= kMaxSplitWaves * resident_blocks;
       splits *= 2)
    options.push_back(splits);
  return options;
}

std::vector<int> SkinnyGemm::split_options(int in, int out) const {
  return skinny_split_options(in, out, target_blocks_);
}

void SkinnyGemm::run(const bf16* x, const bf16* w, bf16* y, int rows, int in, int out, int splits) {
  launch(x, w, y, rows, in, out, splits);
}

void SkinnyGemm::run(const bf16* x, const bf16* w, float* y, int rows, int in, int out,
                     int splits) {
  launch(x, w, y, rows, in, out, splits);
}

void SkinnyGemm::run_silu_mul(const bf16* x, const bf16* w_gate_up, bf16* act, int rows, int in,
                              int inter, int splits) {
  launch<bf16, true>(x, w_gate_up, act, rows, in, 2 * inter, splits);
}

template <typename Out, bool kSiluMul>
void SkinnyGemm::launch(const bf16* x, const bf16* w, Out* y, int rows, int in, int out,
                        int splits) {
  if (!skinny_gemm_applies(rows, in))
    throw std::invalid_argument("SkinnyGemm: " + std::to_string(rows) + " rows of " +
                                std::to_string(in) + " is outside 2.." +
                                std::to_string(kSkinnyMaxRows) + " rows of a multiple of 8");
  if (out <= 0) throw std::invalid_argument("SkinnyGemm: no output columns");
  const std::vector<int> options = split_options(in, out);
  if (std::find(options.begin(), options.end(), splits) == options.end())
    throw std::invalid_argument("SkinnyGemm: " + std::to_string(splits) + " splits of " +
                                std::to_string(in) + " for " + std::to_string(out) +
                                " columns is not one of split_options()");
  const int per_split = (in + splits - 1) / splits;
  const int k_slice = (per_split + kChunk - 1) / kChunk * kChunk;
  const dim3 grid(tiles_for(out), splits);
  const int build = skinny_build_rows(rows);
  const auto kernel = build == 8    ? skinny_gemm_kernel<1, Out, kSiluMul>
                      : build == 16 ? skinny_gemm_kernel<2, Out, kSiluMul>
                      : build == 32 ? skinny_gemm_kernel<4, Out, kSiluMul>
                                    : skinny_gemm_kernel<8, Out, kSiluMul>;
  launch_dependent(kernel, grid, kThreads, 0, stream_, x, w, y, rows, in, out, k_slice,
                   partials_.data(), arrivals_.data());
}

}  // namespace pipeline::cuda
