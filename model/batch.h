// What one forward pass runs: for each sequence, its new tokens at their positions and the
// block table that holds (and will hold) its keys and values. Prefill batches carry prompt
// chunks (ragged: each its own length; a long prompt is split over several passes) and may end
// with one token of each running sequence decoding alongside; decode batches carry one token
// per sequence.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/row_argmax.h"

namespace pipeline {

struct SequenceChunk {
  std::vector<int32_t> tokens;       // new tokens, at positions start_pos, start_pos+1, ...
  int32_t start_pos = 0;             // tokens before it are already in the KV cache
  std::vector<int32_t> block_table;  // covers positions [0, start_pos + tokens.size())
  bool all_logits = false;           // logits for every new token, not just the last
  // Its row is read only for its argmax: a greedy draw with nothing that changes the logits and
  // no logprobs (Sampler::draws_argmax). See Batch::argmax_only.
  bool argmax_only = false;
};

struct Batch {
  std::vector<SequenceChunk> seqs;

  int total_tokens() const;
  // Logit rows the forward pass returns: one per sequence, or one per token when all_logits.
  int logit_rows() const;
  bool is_decode() const;  // every sequence brings exactly one token
  // Every chunk's row is read only for its argmax (and none has all_logits). A runner then returns
  // the rows' argmaxes (Logits::argmax) and not the rows: a GPU finds them where the logits are,
  // and a 64-sequence step's 8 MB of rows stay off the bus.
  bool argmax_only() const;
};

// Rows of logits in batch order (sequence by sequence; within one, position by position), or, for
// a batch that is argmax_only(), each row's argmax alone.
struct Logits {
  int vocab = 0;
  std::vector<float> data;        // [rows, vocab]; empty when the pass returned argmaxes
  std::vector<RowArgmax> argmax;  // one per row when the pass returned argmaxes; else empty

  int rows() const {
    return !argmax.empty() ? int(argmax.size()) : vocab ? int(data.size() / vocab) : 0;
  }
  std::span<const float> row(int i) const {
    return {data.data() + size_t(i) * vocab, size_t(vocab)};
  }
  std::span<float> row(int i) { return {data.data() + size_t(i) * vocab, size_t(vocab)}; }
};

}  // namespace pipeline
