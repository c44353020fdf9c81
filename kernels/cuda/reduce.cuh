// Warp and block sums shared by the kernels. Every thread of the block must call block_sum
// (it synchronises); all of them get the result.
#pragma once

#include <cuda_runtime.h>

namespace pipeline::cuda {

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// `scratch` holds at least 32 floats; blockDim.x is a multiple of 32.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  v = warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < warps; ++w) total += scratch[w];
  __syncthreads();  // scratch may be reused at once
  return total;
}

}  // namespace pipeline::cuda
