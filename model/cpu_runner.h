// The LLaMA forward pass on the CPU, exactly as Hugging Face's LlamaForCausalLM computes it
// (float32 activations and accumulation; weights kept in their checkpoint dtype). A bf16
// checkpoint's matmuls round their inputs to bf16 unless RunnerOptions::matmul_activations is F32
// (kernels/cpu/packed_matmul.h).
//
// Weights: at construction every projection is repacked into the matmul's panel layout (see
// kernels/cpu/packed_matmul.h), q/k/v and gate/up each fused into one matrix, and the lm_head
// too; the embedding stays in the checkpoint and is read a row per token. When the weights come
// from a checkpoint's file mappings (LlamaWeights::checkpoint set), the mapped pages of each
// repacked tensor are released as soon as it is packed, so the weights are resident once: peak
// memory stays near the file size, not twice it.
//
// KV pool: in host memory, float32 or bf16 (RunnerOptions::kv_cache_dtype; by default float32
// for float32 weights, else bf16), laid out as kernels/cpu/paged_kv.h says. With
// RunnerOptions::kv_cache_blocks = 0 the runner sizes it for max_num_seqs full contexts
// (max_position_embeddings tokens each) but never above 4 GiB (K and V of all layers together)
// nor half the memory the weights leave (the machine's, or its cgroup's limit), and at least
// one block; a pool given that does not fit beside the weights is refused. The whole pool is made
// resident at construction (cpu::make_resident), so no decode step stops on page faults as its
// sequences take new blocks, and a pool the machine cannot hold fails at start rather than under
// load (model/cpu_kv_pool.h sizes it).
//
// Threads: RunnerOptions::threads > 0 runs every kernel in a oneTBB task_arena of that many
// threads; 0 runs them in the caller's arena (inside the engine, the flow graph's own; alone,
// the process's default, all cores).
//
// forward() is not reentrant: one caller at a time (the graph's serial prefill/decode nodes).
// Scratch buffers live in the runner and only grow, so steady decoding does not allocate; they
// are huge-page memory (cpu::ScratchArray), so the first long prefill does not stop on tens of
// thousands of page faults.
#pragma once

#include <cstdint>
#include <memory>

#include "model/llama_weights.h"
#include "model/model_runner.h"

namespace pipeline {

// Throws std::invalid_argument on options or weights the runner cannot use (block size, thread
// count, head layout, a tensor whose shape disagrees with the config).
std::unique_ptr<ModelRunner> make_cpu_runner(std::shared_ptr<const LlamaWeights> weights,
                                             const RunnerOptions& options);

}  // namespace pipeline
