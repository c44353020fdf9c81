// bf16 values moved as one vector load or store: the unit in which the kernels stream weights,
// KV rows and activations.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace pipeline::cuda {

// Eight bf16 values read as one 16-byte vector (a uint4), widened to float32.
__device__ __forceinline__ void unpack8(const uint4& raw, float* out) {
  const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 f = __bfloat1622float2(pairs[j]);
    out[2 * j] = f.x;
    out[2 * j + 1] = f.y;
  }
}

// N consecutive bf16 (N = 1, 2, 4 or 8), aligned so that a copy is one access of 2 to 16 bytes.
template <int N>
struct alignas(2 * N) Bf16Pack {
  __nv_bfloat16 v[N];
};

template <int N>
__device__ __forceinline__ Bf16Pack<N> load_pack(const __nv_bfloat16* p) {
  return *reinterpret_cast<const Bf16Pack<N>*>(p);
}

template <int N>
__device__ __forceinline__ void store_pack(__nv_bfloat16* p, const Bf16Pack<N>& pack) {
  *reinterpret_cast<Bf16Pack<N>*>(p) = pack;
}

// x as a bf16 store and reload would leave it: where a fused kernel keeps in registers a value
// that the unfused path stores as bf16, it rounds it here so both paths compute the same.
__device__ __forceinline__ float round_to_bf16(float x) {
  return __bfloat162float(__float2bfloat16(x));
}

// A float32 result stored as the output's type.
__device__ __forceinline__ void store_value(float* y, float v) {
  *y = v;
}
__device__ __forceinline__ void store_value(__nv_bfloat16* y, float v) {
  *y = __float2bfloat16(v);
}

}  // namespace pipeline::cuda
