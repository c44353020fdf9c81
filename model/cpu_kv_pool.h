// The CPU runner's KV pool: its element type and its size in blocks, and the check that it fits
// in the memory this process has beside the weights (model/cpu_runner.h says the policy).
#pragma once

#include <cstdint>

#include "model/kv_cache.h"
#include "model/llama_weights.h"
#include "model/model_runner.h"

namespace pipeline {

// The most host memory a derived CPU KV pool may take (and at most half what the weights leave).
inline constexpr int64_t kCpuKvPoolMaxBytes = int64_t(4) << 30;

// The pool's shape for these weights and options: RunnerOptions::kv_cache_blocks, or with 0
// max_num_seqs full contexts within kCpuKvPoolMaxBytes and half the memory the weights leave.
// Throws std::invalid_argument on options the CPU runner cannot use, and std::runtime_error
// naming the settings when the pool cannot fit beside the weights.
KvCacheShape derive_cpu_kv_shape(const LlamaWeights& weights, const RunnerOptions& options);

}  // namespace pipeline
