// A LLaMA checkpoint on the device: every tensor converted to bf16, q/k/v fused into one
// [q_dim + 2 * kv_dim, hidden] matrix and gate/up into one [2 * intermediate, hidden] matrix so
// each takes a single GEMM. The gate and up rows alternate (gate j at row 2j, up j at 2j + 1):
// each pair that SiLU*mul combines is two adjacent output columns, which the projection's own
// epilogue can combine (Gemm::linear_silu_mul).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

#include "kernels/cuda/device_buffer.h"
#include "model/llama_weights.h"

namespace pipeline::cuda {

struct DeviceLayer {
  DeviceBuffer<__nv_bfloat16> attn_norm;  // [hidden]
  DeviceBuffer<__nv_bfloat16> wqkv;       // [q_dim + 2 * kv_dim, hidden]
  DeviceBuffer<__nv_bfloat16> wo;         // [hidden, q_dim]
  DeviceBuffer<__nv_bfloat16> mlp_norm;   // [hidden]
  DeviceBuffer<__nv_bfloat16> w_gate_up;  // [2 * intermediate, hidden], gate and up interleaved
  DeviceBuffer<__nv_bfloat16> w_down;     // [hidden, intermediate]
};

struct DeviceWeights {
  DeviceBuffer<__nv_bfloat16> embed;  // [vocab, hidden]
  std::vector<DeviceLayer> layers;
  DeviceBuffer<__nv_bfloat16> final_norm;      // [hidden]
  DeviceBuffer<__nv_bfloat16> untied_lm_head;  // [vocab, hidden]; empty when tied
  const __nv_bfloat16* lm_head = nullptr;      // untied_lm_head or embed
};

// Device bytes the bf16 weights take, to check the fit before uploading.
size_t device_weight_bytes(const LlamaWeights& weights);
// Device bytes upload_weights() holds besides the weights while it runs (its staging buffer and
// one layer's gate and up before they are interleaved).
size_t upload_scratch_bytes(const LlamaConfig& config);

// The bf16 bytes a decode step reads: every matrix but the embedding (only gathered rows).
size_t decode_weight_bytes(const LlamaConfig& config);

DeviceWeights upload_weights(const LlamaWeights& weights, cudaStream_t stream);

}  // namespace pipeline::cuda
