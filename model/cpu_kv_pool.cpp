#include "model/cpu_kv_pool.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>

namespace pipeline {
namespace {

std::string gib_text(double bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f GiB", bytes / double(int64_t(1) << 30));
  return text;
}

// The memory this process may use: the machine's, or its cgroup's limit (a container's) when
// that is less.
double memory_bytes() {
  double memory = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE));
  std::ifstream limit("/sys/fs/cgroup/memory.max");  // cgroup v2; "max" when there is none
  double cgroup = 0;
  if (limit >> cgroup && cgroup > 0) memory = std::min(memory, cgroup);
  return memory;
}

// What the packed weights keep resident: every matrix and norm the runner copies out of the
// checkpoint (the embedding, when not tied to lm_head, is read in place from the file).
double resident_weight_bytes(const LlamaWeights& weights) {
  double bytes = double(weights.lm_head.nbytes() + weights.final_norm.nbytes());
  for (const LayerWeights& l : weights.layers)
    for (const TensorView* t :
         {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.wo, &l.mlp_norm, &l.w_gate, &l.w_up, &l.w_down})
      bytes += double(t->nbytes());
  return bytes;
}

// A pool the host could never hold beside the weights fails here, naming the settings, rather
// than as a bad_alloc or an out-of-memory kill while it is made resident.
void check_pool_fits_memory(const KvCacheShape& shape, double block_bytes, double weight_bytes) {
  const double memory = memory_bytes();
  const double pool = block_bytes * double(shape.num_blocks);
  if (weight_bytes + pool > memory)
    throw std::runtime_error(
        "the KV cache of " + std::to_string(shape.num_blocks) + " blocks of " +
        std::to_string(shape.block_size) + " tokens needs " + gib_text(pool) + ", which with " +
        gib_text(weight_bytes) + " of weights is more than the " + gib_text(memory) +
        " of memory this process has: lower scheduler.kv_cache_blocks or scheduler.kv_block_size");
}

// The KV cache's element type: the one asked for, else float32 for float32 weights and bf16 for
// 16-bit ones, as the CUDA backend stores it: a checkpoint already rounded to 16 bits loses
// little more when its keys and values are (bench/README.md has the figures).
DType kv_dtype(const LlamaWeights& weights, const RunnerOptions& options) {
  const DType dtype = options.kv_cache_dtype.value_or(
      weights.layers.empty() || weights.layers[0].wk.dtype == DType::F32 ? DType::F32
                                                                         : DType::BF16);
  if (dtype != DType::F32 && dtype != DType::BF16)
    throw std::invalid_argument(std::string("RunnerOptions: kv_cache_dtype ") + dtype_name(dtype) +
                                " is not supported by the CPU runner (F32 or BF16)");
  return dtype;
}

}  // namespace

KvCacheShape derive_cpu_kv_shape(const LlamaWeights& weights, const RunnerOptions& options) {
  const LlamaConfig& c = weights.config;
  check_runner_options(options);
  KvCacheShape shape;
  shape.num_layers = c.num_layers;
  shape.num_kv_heads = c.num_kv_heads;
  shape.head_dim = c.head_dim;
  shape.block_size = options.kv_block_size;
  shape.dtype = kv_dtype(weights, options);
  const double weight_bytes = resident_weight_bytes(weights);
  // In floating point: a block size from the config times the head layout can pass 2^63.
  const double block_bytes = 2.0 * c.num_layers * double(shape.block_size) * c.num_kv_heads *
                             c.head_dim * double(dtype_size(shape.dtype));
  if (options.kv_cache_blocks > 0) {
    shape.num_blocks = options.kv_cache_blocks;
  } else {
    if (options.max_num_seqs <= 0) {
      throw std::invalid_argument(
          "RunnerOptions: max_num_seqs must be positive to size the KV pool");
    }
    const int64_t wanted =
        int64_t(options.max_num_seqs) * shape.blocks_for(c.max_position_embeddings);
    // Half the memory the weights leave at most, so a small machine still runs the model on a
    // smaller pool, with room for the rest of the process.
    const double room = std::max(0.0, memory_bytes() - weight_bytes);
    const double cap = std::floor(std::min(double(kCpuKvPoolMaxBytes), room / 2) / block_bytes);
    shape.num_blocks = int(std::max(1.0, std::min(double(wanted), cap)));
  }
  check_pool_fits_memory(shape, block_bytes, weight_bytes);
  return shape;
}

}  // namespace pipeline
