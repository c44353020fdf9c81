#include "kernels/cuda/step_inputs.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace pipeline::cuda {

StepLayout::StepLayout(const StepCapacity& capacity, int max_blocks, int tile_size)
    : max_blocks_per_seq(max_blocks), tile_queries(tile_size) {
  const size_t tokens = size_t(capacity.tokens), seqs = size_t(capacity.seqs);
  const size_t max_tiles = tokens / size_t(tile_size) + seqs;
  size_t at = 0;
  auto take = [&at](size_t n) {
    const size_t offset = at;
    at += (n + 3) / 4 * 4;  // 16-byte aligned arrays
    return offset;
  };
  token_ids = take(tokens);
  positions = take(tokens);
  slots = take(tokens);
  logit_rows = take(size_t(capacity.logit_rows));
  context_lens = take(seqs);
  q_offsets = take(seqs);
  q_lens = take(seqs);
  start_positions = take(seqs);
  tiles = take(2 * max_tiles);
  block_tables = take(seqs * size_t(max_blocks));
  total = at;
}

void validate_batch(const Batch& batch, const LlamaConfig& config, const KvCacheShape& kv) {
  auto fail = [](size_t seq, const std::string& what) {
    throw std::invalid_argument("CUDA forward: sequence " + std::to_string(seq) + ": " + what);
  };
  if (batch.seqs.empty()) throw std::invalid_argument("CUDA forward: the batch has no sequences");
  for (size_t s = 0; s < batch.seqs.size(); ++s) {
    const SequenceChunk& chunk = batch.seqs[s];
    if (chunk.tokens.empty()) fail(s, "no new tokens");
    if (chunk.start_pos < 0) fail(s, "negative start_pos " + std::to_string(chunk.start_pos));
    const int64_t end = int64_t(chunk.start_pos) + int64_t(chunk.tokens.size());
    if (end > config.max_position_embeddings)
      fail(s, "positions up to " + std::to_string(end - 1) + " exceed max_position_embeddings " +
                  std::to_string(config.max_position_embeddings));
    for (int32_t token : chunk.tokens)
      if (token < 0 || token >= config.vocab_size)
        fail(s, "token id " + std::to_string(token) + " outside the vocabulary of " +
                    std::to_string(config.vocab_size));
    const int needed = kv.blocks_for(int(end));
    if (int(chunk.block_table.size()) < needed)
      fail(s, "block table has " + std::to_string(chunk.block_table.size()) +
                  " blocks, positions up to " + std::to_string(end - 1) + " need " +
                  std::to_string(needed));
    for (int b = 0; b < needed; ++b)
      if (chunk.block_table[b] < 0 || chunk.block_table[b] >= kv.num_blocks)
        fail(s, "block id " + std::to_string(chunk.block_table[b]) + " outside the KV pool of " +
                    std::to_string(kv.num_blocks) + " blocks");
  }
}

StepShape pack_step(const Batch& batch, const StepLayout& layout, int block_size, int32_t* packed) {
  StepShape shape;
  shape.decode = batch.is_decode();
  shape.seqs = int(batch.seqs.size());
  int t = 0, row = 0, tile = 0;
  for (int s = 0; s < shape.seqs; ++s) {
    const SequenceChunk& chunk = batch.seqs[s];
    const int n = int(chunk.tokens.size());
    const int end = chunk.start_pos + n;
    packed[layout.context_lens + s] = end;
    shape.max_context = std::max(shape.max_context, end);
    packed[layout.q_offsets + s] = t;
    packed[layout.q_lens + s] = n;
    packed[layout.start_positions + s] = chunk.start_pos;
    for (int i = 0; i < n; ++i) {
      const int position = chunk.start_pos + i;
      packed[layout.token_ids + t + i] = chunk.tokens[i];
      packed[layout.positions + t + i] = position;
      packed[layout.slots + t + i] =
          chunk.block_table[position / block_size] * block_size + position % block_size;
    }
    if (chunk.all_logits) {
      for (int i = 0; i < n; ++i) packed[layout.logit_rows + row++] = t + i;
    } else {
      packed[layout.logit_rows + row++] = t + n - 1;
    }
    for (int first = 0; first < n; first += layout.tile_queries) {
      packed[layout.tiles + 2 * tile] = s;
      packed[layout.tiles + 2 * tile + 1] = first;
      ++tile;
    }
    const int blocks = (end + block_size - 1) / block_size;
    std::copy_n(chunk.block_table.begin(), blocks,
                packed + layout.block_tables + size_t(s) * layout.max_blocks_per_seq);
    t += n;
  }
  shape.tokens = t;
  shape.logit_rows = row;
  shape.tiles = tile;
  shape.packed_elements = layout.block_tables + size_t(shape.seqs) * layout.max_blocks_per_seq;
  return shape;
}

}  // namespace pipeline::cuda
