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
//
// Two kernels differ only in how the weights reach the lanes (SkinnyGemmKernel): the direct one
// loads a pass of chunks (four, two at 64 rows) into registers and then multiplies them, so a warp
// has bytes in flight only between its passes' multiplies; the pipelined one copies them (cp.async)
// into a ring in shared memory, kStages - 1 stages ahead of the one it multiplies, so the weight
// stream keeps going while the block computes.
#include <algorithm>
#include <optional>
#include <stdexcept>
#include <string>

#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/bf16_vector.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_objects.h"
#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/kernel_choice.h"
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

// The pipelined kernel's ring: kStages stages of kStageChunks chunks, each chunk a lane's two
// 16-byte pieces (weight rows g and g + 8), laid out so that a warp's 32 lanes read 512
// consecutive bytes. Four stages ahead is 8 KiB in flight per warp, 128 KiB per multiprocessor
// of two blocks (what the GEMV kernel keeps in flight, which streams at the device's bandwidth),
// against the direct kernel's 4 KiB per warp (2 KiB at 64 rows), and none while it multiplies.
constexpr int kStages = 5;
constexpr int kStageChunks = 2;
constexpr int kStageK = kChunk * kStageChunks;
constexpr size_t kRingBytes = size_t(kStages) * kStageChunks * 2 * kThreads * sizeof(uint4);

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

// What a lane of block (column tile, split) works on: its two weight rows and its k range.
// Each split walks k_slice values of k (a multiple of kChunk); splits past `in` walk none.
struct SkinnyLane {
  int g, t;                // lane / 4, lane % 4
  int column_a, column_b;  // this lane's weight rows: g and g + 8 of the warp's 16
  int k_begin, k_end;      // the block's k range
  const bf16* w_a;         // weight row column_a at k = 8t
  const bf16* w_b;         // weight row column_b at k = 8t
  const bf16* x_lane;      // x row g at k = 8t
  int rows, in, out;

  // Whether this lane's 8 values of the chunk at k0 are inside the block's k range (`in` and
  // k_end are multiples of 8).
  __device__ bool in_k(int k0) const { return k0 + 8 * t < k_end; }
  __device__ bool has_a(int k0) const { return in_k(k0) && column_a < out; }
  __device__ bool has_b(int k0) const { return in_k(k0) && column_b < out; }
};

__device__ __forceinline__ SkinnyLane skinny_lane(const bf16* x, const bf16* w, int rows, int in,
                                                  int out, int k_slice) {
  SkinnyLane l;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  l.g = lane / 4;
  l.t = lane % 4;
  l.column_a = blockIdx.x * kTileColumns + warp * 16 + l.g;
  l.column_b = l.column_a + 8;
  l.k_begin = blockIdx.y * k_slice;
  l.k_end = min(in, l.k_begin + k_slice);
  l.w_a = w + size_t(l.column_a) * in + 8 * l.t;
  l.w_b = w + size_t(l.column_b) * in + 8 * l.t;
  l.x_lane = x + size_t(l.g) * in + 8 * l.t;
  l.rows = rows;
  l.in = in;
  l.out = out;
  return l;
}

// x rows g, g + 8, ... of the chunk at k0, as the B operands of this lane's mma's. x comes
// from L1 or L2: the previous kernel wrote it.
template <int kTiles>
__device__ __forceinline__ void load_x(uint4 (&xv)[kTiles], const SkinnyLane& l, int k0) {
#pragma unroll
  for (int j = 0; j < kTiles; ++j)
    xv[j] = load_or_zero(l.x_lane + size_t(8 * j) * l.in + k0, l.in_k(k0) && l.g + 8 * j < l.rows);
}

// acc += this lane's weights wa (row column_a) and wb (column_b) of a chunk times its x. Every
// lane of the warp calls it for the same chunk: mma.sync needs the whole warp.
template <int kTiles>
__device__ __forceinline__ void multiply(float (&acc)[kTiles][4], const uint4& wa, const uint4& wb,
                                         const uint4 (&xv)[kTiles]) {
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
    mma_16x8x16(acc[j], wa.x, wb.x, wa.y, wb.y, xv[j].x, xv[j].y);
    mma_16x8x16(acc[j], wa.z, wb.z, wa.w, wb.w, xv[j].z, xv[j].w);
  }
}

// Writes the block's results: y (or, with kSiluMul, silu(gate) * up of the column pairs) when
// the call is not split; otherwise this block's float32 partials, and the last block of the
// column tile to arrive sums every split's and writes y.
template <int kTiles, typename Out, bool kSiluMul>
__device__ __forceinline__ void finish_block(float (&acc)[kTiles][4], const SkinnyLane& l,
                                             Out* __restrict__ y, float* __restrict__ partials,
                                             int32_t* __restrict__ arrivals) {
  __shared__ bool last_to_arrive;
  const int rows = l.rows, out = l.out;
  const int tile = blockIdx.x, split = blockIdx.y, splits = gridDim.y;
  // acc[j][e] is output column (e < 2 ? column_a : column_b), x row 8j + 2t + (e & 1).
  auto for_each_result = [&](auto&& visit) {
#pragma unroll
    for (int j = 0; j < kTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int column = e < 2 ? l.column_a : l.column_b;
        const int row = 8 * j + 2 * l.t + (e & 1);
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
        const int column = e < 2 ? l.column_a : l.column_b;
        const int row = 8 * j + 2 * l.t + (e & 1);
        if (l.g % 2 == 0 && column < out && row < rows)
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

// Grid (column tile, split). kTiles n-tiles of 8 x rows: rows <= 8 * kTiles. With kSiluMul the
// `out` columns are interleaved (gate, up) pairs and y [rows, out / 2] gets silu(gate) * up.
template <int kTiles, typename Out, bool kSiluMul>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    skinny_gemm_direct_kernel(const bf16* __restrict__ x, const bf16* __restrict__ w,
                              Out* __restrict__ y, int rows, int in, int out, int k_slice,
                              float* __restrict__ partials, int32_t* __restrict__ arrivals) {
  const SkinnyLane l = skinny_lane(x, w, rows, in, out, k_slice);
  // Chunks of weights each lane has in flight: 4, or 2 where 8 n-tiles of accumulators and x
  // leave no registers for more.
  constexpr int kUnroll = kTiles <= 4 ? 4 : 2;
  uint4 wa[kUnroll], wb[kUnroll];
  auto load_weights = [&](int k0) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int k = k0 + kChunk * u;
      wa[u] = stream_or_zero(l.w_a + k, l.has_a(k));
      wb[u] = stream_or_zero(l.w_b + k, l.has_b(k));
    }
  };
  // No kernel writes the weights, so the first pass's loads go out before waiting for the
  // kernel ahead: with programmatic dependent launch they overlap its last blocks.
  load_weights(l.k_begin);
  wait_for_previous_kernel();
  allow_next_kernel();

  float acc[kTiles][4] = {};
  // x is loaded one chunk at a time (64 rows of it for every chunk in flight would not fit in
  // registers beside the weights); the compiler hoists what the registers allow.
  for (int k0 = l.k_begin; k0 < l.k_end; k0 += kChunk * kUnroll) {
    if (k0 != l.k_begin) load_weights(k0);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      uint4 xv[kTiles];
      load_x(xv, l, k0 + kChunk * u);
      multiply(acc, wa[u], wb[u], xv);
    }
  }
  finish_block<kTiles, Out, kSiluMul>(acc, l, y, partials, arrivals);
}

// The same product with the weights copied through a ring in dynamic shared memory of
// kRingBytes. A lane reads back only the pieces it copied itself, so the stages need no barrier,
// only the wait for the lane's own copy groups: one group per stage, empty or not, so that
// "all but kStages - 1 groups done" always means "this stage has landed".
template <int kTiles, typename Out, bool kSiluMul>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    skinny_gemm_pipelined_kernel(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                 Out* __restrict__ y, int rows, int in, int out, int k_slice,
                                 float* __restrict__ partials, int32_t* __restrict__ arrivals) {
  extern __shared__ uint4 ring[];
  const SkinnyLane l = skinny_lane(x, w, rows, in, out, k_slice);
  const int stages = l.k_end > l.k_begin ? (l.k_end - l.k_begin + kStageK - 1) / kStageK : 0;
  // This lane's piece of weight row a (ab = 0) or b (1) of chunk c of stage s, in slot s % kStages.
  auto piece = [&](int s, int c, int ab) {
    return ring + ((s % kStages * kStageChunks + c) * 2 + ab) * kThreads + threadIdx.x;
  };
  // Past the k range or the weight rows a piece is zero-filled, and `w` (a valid address) is
  // given as its source, which the copy then does not read.
  auto copy_stage = [&](int s) {
#pragma unroll
    for (int c = 0; c < kStageChunks; ++c) {
      const int k = l.k_begin + s * kStageK + kChunk * c;
      copy_16_async(piece(s, c, 0), l.has_a(k) ? l.w_a + k : w, l.has_a(k));
      copy_16_async(piece(s, c, 1), l.has_b(k) ? l.w_b + k : w, l.has_b(k));
    }
  };
  // The first kStages - 1 stages go out before waiting for the kernel ahead (no kernel writes
  // the weights).
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < stages) copy_stage(s);
    commit_async_copies();
  }
  wait_for_previous_kernel();
  allow_next_kernel();

  // x of the stage's first kEarlyChunks chunks is loaded before the wait for its weights, so
  // that the two latencies overlap (the wait's memory clobber keeps later loads behind it); at
  // 64 rows, x of more than one chunk would not fit in registers beside the accumulators.
  constexpr int kEarlyChunks = kTiles <= 4 ? kStageChunks : 1;
  float acc[kTiles][4] = {};
  for (int s = 0; s < stages; ++s) {
    // Slot (s - 1) % kStages, which this refills, was read by this lane's multiplies of stage
    // s - 1, issued before this copy.
    if (s + kStages - 1 < stages) copy_stage(s + kStages - 1);
    commit_async_copies();
    const int k0 = l.k_begin + s * kStageK;
    uint4 xv[kStageChunks][kTiles];
#pragma unroll
    for (int c = 0; c < kEarlyChunks; ++c) load_x(xv[c], l, k0 + kChunk * c);
    wait_async_copies<kStages - 1>();  // stage s has landed
#pragma unroll
    for (int c = 0; c < kStageChunks; ++c) {
      if (c >= kEarlyChunks) load_x(xv[c], l, k0 + kChunk * c);
      multiply(acc, *piece(s, c, 0), *piece(s, c, 1), xv[c]);
    }
  }
  finish_block<kTiles, Out, kSiluMul>(acc, l, y, partials, arrivals);
}

// The kernel of a build (rows 8, 16, 32 or 64) for one output type.
template <typename Out, bool kSiluMul>
auto kernel_for(SkinnyGemmKernel kernel, int build) {
  const bool pipelined = kernel == SkinnyGemmKernel::pipelined;
  switch (build) {
    case 8:
      return pipelined ? skinny_gemm_pipelined_kernel<1, Out, kSiluMul>
                       : skinny_gemm_direct_kernel<1, Out, kSiluMul>;
    case 16:
      return pipelined ? skinny_gemm_pipelined_kernel<2, Out, kSiluMul>
                       : skinny_gemm_direct_kernel<2, Out, kSiluMul>;
    case 32:
      return pipelined ? skinny_gemm_pipelined_kernel<4, Out, kSiluMul>
                       : skinny_gemm_direct_kernel<4, Out, kSiluMul>;
    default:
      return pipelined ? skinny_gemm_pipelined_kernel<8, Out, kSiluMul>
                       : skinny_gemm_direct_kernel<8, Out, kSiluMul>;
  }
}

// Lets every build of the pipelined kernel for one output type have its ring, and asks for the
// shared memory of kBlocksPerSm of them per multiprocessor, leaving the rest to L1 (x comes from
// there).
template <typename Out, bool kSiluMul>
void allow_rings(int carveout_percent) {
  for (int build : kSkinnyBuildRows) {
    const auto kernel = kernel_for<Out, kSiluMul>(SkinnyGemmKernel::pipelined, build);
    PIPELINE_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kRingBytes)));
    PIPELINE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                             carveout_percent));
  }
}

int tiles_for(int out) {
  return (out + kTileColumns - 1) / kTileColumns;
}

}  // namespace

const char* skinny_gemm_kernel_name(SkinnyGemmKernel kernel) {
  return kernel == SkinnyGemmKernel::pipelined ? "pipelined" : "direct";
}

SkinnyGemmKernel skinny_gemm_kernel_named(const std::string& name) {
  return kernel_named(kSkinnyGemmKernels, skinny_gemm_kernel_name, "SkinnyGemm kernel", name);
}

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

  // The pipelined kernel where kBlocksPerSm blocks of a multiprocessor may have their rings
  // (compute capability 8.0 and 9.0: A100, H100, H200; not the 100 KiB multiprocessors of 8.6
  // and 8.9). Shared memory per block past 48 KiB is asked for explicitly.
  int device = 0, per_block = 0, per_sm = 0;
  PIPELINE_CUDA_CHECK(cudaGetDevice(&device));
  PIPELINE_CUDA_CHECK(
      cudaDeviceGetAttribute(&per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  PIPELINE_CUDA_CHECK(
      cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device));
  // The ring, the kernel's few static bytes and the 1 KiB the system reserves per block.
  constexpr size_t kPerBlock = kRingBytes + 2048;
  if (size_t(per_block) >= kPerBlock && size_t(per_sm) >= kBlocksPerSm * kPerBlock) {
    // The driver rounds a carveout up to the next size the multiprocessor supports, so the
    // percentage just under what the blocks need leaves the most L1 for x: 71% of an H200's
    // 228 KiB becomes 164 KiB (ceil's 72% would become 196 KiB).
    const int carveout = int(100 * kBlocksPerSm * kPerBlock / per_sm);
    allow_rings<bf16, false>(carveout);
    allow_rings<float, false>(carveout);
    allow_rings<bf16, true>(carveout);
    kernels_.push_back(SkinnyGemmKernel::pipelined);
  }
  keep_the_kernel_set();
}

void SkinnyGemm::keep_the_kernel_set() {
  const std::optional<SkinnyGemmKernel> kernel = kernel_from_environment(
      kSkinnyGemmVariable, kSkinnyGemmKernels, skinny_gemm_kernel_name, "SkinnyGemm kernel");
  if (!kernel) return;
  if (std::find(kernels_.begin(), kernels_.end(), *kernel) == kernels_.end())
    throw std::invalid_argument(std::string(kSkinnyGemmVariable) + ": the " +
                                skinny_gemm_kernel_name(*kernel) +
                                " kernel does not run on this device (two blocks of a "
                                "multiprocessor cannot have their shared memory)");
  kernels_ = {*kernel};
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

std::vector<SkinnyPlan> SkinnyGemm::plans(int in, int out) const {
  std::vector<SkinnyPlan> plans;
  for (SkinnyGemmKernel kernel : kernels_)
    for (int splits : split_options(in, out)) plans.push_back(SkinnyPlan{splits, kernel});
  return plans;
}

void SkinnyGemm::run(const bf16* x, const bf16* w, bf16* y, int rows, int in, int out,
                     const SkinnyPlan& plan) {
  launch(x, w, y, rows, in, out, plan);
}

void SkinnyGemm::run(const bf16* x, const bf16* w, float* y, int rows, int in, int out,
                     const SkinnyPlan& plan) {
  launch(x, w, y, rows, in, out, plan);
}

void SkinnyGemm::run_silu_mul(const bf16* x, const bf16* w_gate_up, bf16* act, int rows, int in,
                              int inter, const SkinnyPlan& plan) {
  launch<bf16, true>(x, w_gate_up, act, rows, in, 2 * inter, plan);
}

template <typename Out, bool kSiluMul>
void SkinnyGemm::launch(const bf16* x, const bf16* w, Out* y, int rows, int in, int out,
                        const SkinnyPlan& plan) {
  if (!skinny_gemm_applies(rows, in))
    throw std::invalid_argument("SkinnyGemm: " + std::to_string(rows) + " rows of " +
                                std::to_string(in) + " is outside 2.." +
                                std::to_string(kSkinnyMaxRows) + " rows of a multiple of 8");
  if (out <= 0) throw std::invalid_argument("SkinnyGemm: no output columns");
  const std::vector<int> options = split_options(in, out);
  if (std::find(options.begin(), options.end(), plan.splits) == options.end())
    throw std::invalid_argument("SkinnyGemm: " + std::to_string(plan.splits) + " splits of " +
                                std::to_string(in) + " for " + std::to_string(out) +
                                " columns is not one of split_options()");
  if (std::find(kernels_.begin(), kernels_.end(), plan.kernel) == kernels_.end())
    throw std::invalid_argument(std::string("SkinnyGemm: the ") +
                                skinny_gemm_kernel_name(plan.kernel) +
                                " kernel does not run on this device (its shared memory)");
  const int per_split = (in + plan.splits - 1) / plan.splits;
  const int k_slice = (per_split + kChunk - 1) / kChunk * kChunk;
  const dim3 grid(tiles_for(out), plan.splits);
  const size_t shared_bytes = plan.kernel == SkinnyGemmKernel::pipelined ? kRingBytes : 0;
  launch_dependent(kernel_for<Out, kSiluMul>(plan.kernel, skinny_build_rows(rows)), grid, kThreads,
                   shared_bytes, stream_, x, w, y, rows, in, out, k_slice, partials_.data(),
                   arrivals_.data());
}

}  // namespace pipeline::cuda
