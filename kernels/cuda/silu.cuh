// SiLU as Hugging Face's LlamaMLP applies it to the gate, in float32: g * sigmoid(g).
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/bf16_vector.cuh"

namespace pipeline::cuda {

__device__ __forceinline__ float silu(float g) {
  return g / (1.0f + expf(-g));
}

// silu(gate) * up in a projection's epilogue, from its float32 gate and up columns rounded to
// bf16 first, as the unfused path (cuBLAS into the bf16 gate_up buffer, then silu_mul) has them:
// so a sequence's activations do not depend on which path its batch's row count takes.
__device__ __forceinline__ float silu_mul_epilogue(float gate, float up) {
  return silu(round_to_bf16(gate)) * round_to_bf16(up);
}

}  // namespace pipeline::cuda
