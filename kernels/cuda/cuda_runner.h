// The CUDA backend's entry points. A plain C++ header (no CUDA includes) so the engine's runner
// factory can include it whenever the project is built with PIPELINE_HAVE_CUDA.
#pragma once

#include <memory>
#include <string>

#include "model/llama_weights.h"
#include "model/model_runner.h"

namespace pipeline {

// True when a CUDA device of compute capability 8.0 or newer (bf16 tensor cores) is usable;
// otherwise false, with the reason in *why when given.
bool cuda_device_available(std::string* why = nullptr);

// Uploads the weights to device 0 as bf16 (q/k/v and gate/up fused), sizes the paged KV cache
// from `options` and returns a runner whose forward() runs there. Throws std::runtime_error
// when no device is usable or when the model and a minimal KV cache do not fit.
std::unique_ptr<ModelRunner> make_cuda_runner(std::shared_ptr<const LlamaWeights> weights,
                                              const RunnerOptions& options);

}  // namespace pipeline
