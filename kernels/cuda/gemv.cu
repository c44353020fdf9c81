// y = x . W^T for a single row x: the projections of a one-sequence decode step. cuBLAS streams
// the smaller of them well below the device's bandwidth. Here kWarpsPerColumn warps share each
// output column, each streaming its slice of the weight row with 16-byte loads, kUnroll in flight
// per lane; the slices are small and many, so the last wave of blocks leaves little of the
// device idle.
#include <stdexcept>

#include "kernels/cuda/bf16_vector.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/silu.cuh"

namespace pipeline::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kThreads = 256;
constexpr int kWarpsPerColumn = 4;
constexpr int kColumnsPerBlock = kThreads / 32 / kWarpsPerColumn;
constexpr int kUnroll = 4;
constexpr int kVector = 8;  // bf16 per 16-byte load

__device__ __forceinline__ float dot8(const uint4& a, const uint4& b) {
  float af[kVector], bf[kVector];
  unpack8(a, af);
  unpack8(b, bf);
  float sum = 0.0f;
#pragma unroll
  for (int j = 0; j < kVector; j += 2) sum += af[j] * bf[j] + af[j + 1] * bf[j + 1];
  return sum;
}

// This lane's kUnroll weight vectors of the pass that starts at `base` (zero from `end` on).
__device__ __forceinline__ void load_weights(const uint4* w_row, int base, int end,
                                             uint4 (&w)[kUnroll]) {
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int v = base + 32 * u;
    // Streamed: each weight is read once per step.
    w[u] = v < end ? __ldcs(w_row + v) : make_uint4(0, 0, 0, 0);
  }
}

// `in` is a multiple of kVector; x and the weight rows are 16-byte aligned. With kSiluMul the
// `out` columns are interleaved (gate, up) pairs and y gets silu(gate) * up, out / 2 values.
template <typename Out, bool kSiluMul>
__global__ void __launch_bounds__(kThreads)
    gemv_kernel(const bf16* __restrict__ x, const bf16* __restrict__ w, Out* __restrict__ y, int in,
                int out) {
  __shared__ float partial[kThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int column = blockIdx.x * kColumnsPerBlock + warp / kWarpsPerColumn;
  const bool active = column < out;
  const int vectors = in / kVector;
  const int per_warp = (vectors + kWarpsPerColumn - 1) / kWarpsPerColumn;
  const int begin = (warp % kWarpsPerColumn) * per_warp;
  const int end = active ? min(vectors, begin + per_warp) : begin;
  const uint4* w_row = reinterpret_cast<const uint4*>(w + size_t(active ? column : 0) * in);

  // No kernel writes the weights, so the first pass's loads go out before waiting for the
  // kernel ahead: with programmatic dependent launch they overlap its last blocks, while the
  // memory would otherwise idle.
  uint4 w_raw[kUnroll];
  load_weights(w_row, begin + lane, end, w_raw);
  wait_for_previous_kernel();
  allow_next_kernel();

  float acc = 0.0f;
  const uint4* x_vec = reinterpret_cast<const uint4*>(x);
  for (int base = begin + lane; base < end; base += 32 * kUnroll) {
    if (base != begin + lane) load_weights(w_row, base, end, w_raw);
    uint4 x_raw[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int v = base + 32 * u;
      x_raw[u] = v < end ? x_vec[v] : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) acc += dot8(w_raw[u], x_raw[u]);
  }
  acc = warp_sum(acc);
  if (lane == 0) partial[warp] = acc;
  __syncthreads();
  // The block's column k (0 .. kColumnsPerBlock - 1): the sum of its warps' slices.
  auto column_total = [&](int k) {
    float total = 0.0f;
#pragma unroll
    for (int p = 0; p < kWarpsPerColumn; ++p) total += partial[k * kWarpsPerColumn + p];
    return total;
  };
  const int first = blockIdx.x * kColumnsPerBlock;
  if constexpr (kSiluMul) {
    // Columns 2j and 2j + 1 are gate j and up j, and a block holds whole pairs.
    static_assert(kColumnsPerBlock % 2 == 0);
    if (threadIdx.x < kColumnsPerBlock / 2) {
      const int k = 2 * threadIdx.x;
      if (first + k < out)
        store_value(y + (first + k) / 2, silu_mul_epilogue(column_total(k), column_total(k + 1)));
    }
  } else if (threadIdx.x < kColumnsPerBlock && first + int(threadIdx.x) < out) {
    store_value(y + first + threadIdx.x, column_total(threadIdx.x));
  }
}

template <typename Out, bool kSiluMul = false>
void launch(const bf16* x, const bf16* w, Out* y, int in, int out, cudaStream_t stream) {
  // An empty grid is a launch error, reported as a later kernel's otherwise.
  if (out <= 0) throw std::invalid_argument("gemv: no output columns");
  const int blocks = (out + kColumnsPerBlock - 1) / kColumnsPerBlock;
  launch_dependent(gemv_kernel<Out, kSiluMul>, blocks, kThreads, 0, stream, x, w, y, in, out);
}

}  // namespace

bool gemv_applies(int rows, int in) {
  return rows == 1 && in % kVector == 0;
}

void gemv(const bf16* x, const bf16* w, bf16* y, int in, int out, cudaStream_t stream) {
  launch(x, w, y, in, out, stream);
}

void gemv(const bf16* x, const bf16* w, float* y, int in, int out, cudaStream_t stream) {
  launch(x, w, y, in, out, stream);
}

void gemv_silu_mul(const bf16* x, const bf16* w_gate_up, bf16* act, int in, int inter,
                   cudaStream_t stream) {
  launch<bf16, true>(x, w_gate_up, act, in, 2 * inter, stream);
}

}  // namespace pipeline::cuda
