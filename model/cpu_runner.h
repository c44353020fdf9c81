// The LLaMA forward pass on the CPU, exactly as Hugging Face's LlamaForCausalLM computes it
// (float32 activations and accumulation; weights kept in their checkpoint dtype).
//
// Weights: at construction every projection is repacked into the matmul's panel layout (see
// kernels/cpu/packed_matmul.h), q/k/v and gate/up each fused into one matrix, and the lm_head
// too; the embedding stays in the checkpoint and is read a row per token. When the weights come
// from a checkpoint's file mappings (LlamaWeights::checkpoint set), the mapped pages of each
// repacked tensor are released as soon as it is packed, so the weights are resident once: peak
// memory stays near the file size, not twice it.
//
// KV pool: float32 in host memory, per layer K and V each [num_blocks][block_size][num_kv_heads]
// [head_dim]. With RunnerOptions::kv_cache_blocks = 0 the runner sizes it for max_num_seqs full
// contexts (max_position_embeddings tokens each) but never above 4 GiB (K and V of all layers
// together), and at least one block. The pool is allocated uninitialised, so the operating system
// only backs the blocks that get written.
//
// Threads: RunnerOptions::threads > 0 runs every kernel in a oneTBB task_arena of that many
// threads; 0 uses the process's default arena (all cores).
//
// forward() is not reentrant: one caller at a time (the graph's serial prefill/decode nodes).
// Scratch buffers live in the runner and only grow, so steady decoding does not allocate.
#pragma once

#include <cstdint>
#include <memory>

#include "model/llama_weights.h"
#include "model/model_runner.h"

namespace pipeline {

// The most host memory a derived CPU KV pool may take (and at most half the machine's).
inline constexpr int64_t kCpuKvPoolMaxBytes = int64_t(4) << 30;

// Throws std::invalid_argument on options or weights the runner cannot use (block size, thread
// count, head layout, a tensor whose shape disagrees with the config).
std::unique_ptr<ModelRunner> make_cpu_runner(std::shared_ptr<const LlamaWeights> weights,
                                             const RunnerOptions& options);

}  // namespace pipeline
