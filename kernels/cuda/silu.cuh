// SiLU as Hugging Face's LlamaMLP applies it to the gate, in float32: g * sigmoid(g).
#pragma once

#include <cuda_runtime.h>

namespace pipeline::cuda {

__device__ __forceinline__ float silu(float g) {
  return g / (1.0f + expf(-g));
}

}  // namespace pipeline::cuda
