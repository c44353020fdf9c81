// Eight bf16 values read as one 16-byte vector (a uint4), widened to float32: the unit in which
// the kernels stream weights and KV rows.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace pipeline::cuda {

__device__ __forceinline__ void unpack8(const uint4& raw, float* out) {
  const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 f = __bfloat1622float2(pairs[j]);
    out[2 * j] = f.x;
    out[2 * j + 1] = f.y;
  }
}

}  // namespace pipeline::cuda
