// The host side of one forward pass: checks a Batch against the model and the KV pool, and
// packs every per-step index array (token ids, positions, KV slots, block tables, ...) into
// one int32 buffer, so a step needs a single host-to-device copy and a captured decode graph
// finds its inputs at fixed device addresses. Plain C++: no CUDA here.
#pragma once

#include <cstddef>
#include <cstdint>

#include "io/model_config.h"
#include "model/batch.h"
#include "model/kv_cache.h"

namespace pipeline::cuda {

// How many tokens, sequences and logit rows the device buffers hold.
struct StepCapacity {
  int tokens = 0;
  int seqs = 0;
  int logit_rows = 0;
};

// Offsets, in int32 elements, of each array inside the packed buffer. Block tables come last
// (row s at block_tables + s * max_blocks_per_seq) so a step copies only the prefix it uses.
struct StepLayout {
  StepLayout(const StepCapacity& capacity, int max_blocks_per_seq, int tile_queries);

  int max_blocks_per_seq;
  int tile_queries;
  size_t token_ids, positions, slots, logit_rows;           // per token (logit_rows: per logit row)
  size_t context_lens, q_offsets, q_lens, start_positions;  // per sequence
  size_t tiles;         // (sequence, first query) pairs of the prefill attention tiles
  size_t block_tables;  // [seqs][max_blocks_per_seq]
  size_t total;
};

struct StepShape {
  int tokens = 0;
  int seqs = 0;
  int logit_rows = 0;
  int tiles = 0;
  int max_context = 0;         // the longest sequence's positions, new tokens included
  bool decode = false;         // one token per sequence
  size_t packed_elements = 0;  // prefix of the packed buffer this step fills
};

// Throws std::invalid_argument naming the sequence and the problem: an empty batch or chunk, a
// token id outside the vocabulary, a position past max_position_embeddings, a block table that
// does not cover the chunk or names a block outside the pool.
void validate_batch(const Batch& batch, const LlamaConfig& config, const KvCacheShape& kv);

// Fills `packed` (layout.total elements) for a batch that fits the layout's capacity.
StepShape pack_step(const Batch& batch, const StepLayout& layout, int block_size, int32_t* packed);

}  // namespace pipeline::cuda
