// What paged_attention's kernels share (kernels/cpu/attention*.cpp): the rows one pass over a KV
// head attends, their online-softmax state, and where a span of a sequence's keys lies in the
// pool. Each kernel computes, for every row, softmax(q · K[0..num_keys)ᵀ · scale) · V; they
// differ only in the vector instructions they use and in the order of their float32 sums.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <span>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/fast_exp.h"
#include "kernels/cpu/paged_kv.h"

namespace pipeline::cpu::detail {

// Rows (a query head at one position) attended in one pass over a KV head's keys and values,
// which are then read from memory once for all of them: the query heads of a GQA group and, in
// a prefill, consecutive queries of the prompt.
constexpr int kMaxRows = 16;
// Positions one vector of scores covers in the AVX-512 kernel (two in the AVX2 one): the vector
// kernels read keys in chunks of 16 positions, so they need blocks of a multiple of 16.
constexpr int kKeyChunk = 16;
// Keys the vector kernels score before they rescale the softmax state and sum their values:
// the reductions and the rescale come once per 64 keys, and a span's keys and values (32 KiB
// at head_dim 64 in float32) stay in L1 for the other rows of the pass.
constexpr int kKeySpan = 64;

// One row of attention: a query head (head_dim floats at q) over the first num_keys positions of
// its sequence, its result to out. Each row's arithmetic is the same whatever rows share its
// pass: a key past a row's own num_keys gets a weight of exactly 0, so a query's result does not
// depend on how a prompt was chunked or batched, and a prefill computes what a decode would.
struct AttentionRow {
  const float* q;
  float* out;
  int num_keys;
};

inline int max_keys(const AttentionRow* rows, int num_rows) {
  int keys = 0;
  for (int r = 0; r < num_rows; ++r) keys = std::max(keys, rows[r].num_keys);
  return keys;
}

// The online softmax of up to kMaxRows rows, each over the keys seen so far: running max, sum
// of exp(score - max), and the values weighted by the same (acc, head_dim floats a row).
struct SoftmaxState {
  float max[kMaxRows];
  float sum[kMaxRows];
  alignas(64) float acc[kMaxRows * kMaxAttentionHeadDim];

  SoftmaxState(int rows, int head_dim) {
    std::fill_n(max, rows, -std::numeric_limits<float>::infinity());
    std::fill_n(sum, rows, 0.0f);
    std::fill_n(acc, rows * head_dim, 0.0f);
  }

  // Folds in a chunk whose largest scaled score is chunk_max; returns the row's new max and
  // sets `correction`, the factor the row's sum and acc must be rescaled by (~0 on the first
  // chunk; exactly 1 when the chunk raises nothing, as for one whose keys the row does not see).
  float raise_max(int row, float chunk_max, float& correction) {
    const float new_max = std::max(max[row], chunk_max);
    correction = fast_exp(max[row] - new_max);
    max[row] = new_max;
    return new_max;
  }

  void write(const AttentionRow* rows, int num_rows, int head_dim) const {
    for (int r = 0; r < num_rows; ++r) {
      const float inv_sum = 1.0f / sum[r];
      for (int d = 0; d < head_dim; ++d) rows[r].out[d] = acc[r * head_dim + d] * inv_sum;
    }
  }
};

// Where a vector kernel finds a span's keys: per chunk of 16 positions, its first position, the
// start of its key rows (key j, dimension d at keys + d · block_size + j) and of its values
// (value j at values + j · head_dim), and how many keys it holds. A chunk never crosses a block,
// the block size being a multiple of 16.
template <class T>
struct SpanChunks {
  static constexpr int kMax = kKeySpan / kKeyChunk;
  int chunks = 0;
  int first[kMax];
  const T* keys[kMax];
  const T* values[kMax];
  int count[kMax];
};

// The keys [first, first + kKeySpan) of KV head kv_head, cut at num_keys (none past it).
template <class T>
SpanChunks<T> span_at(const PagedKvLayer& kv, std::span<const int32_t> block_table, int kv_head,
                      int first, int num_keys) {
  SpanChunks<T> span;
  for (int pos = first; pos < std::min(num_keys, first + kKeySpan); pos += kKeyChunk) {
    const int c = span.chunks++;
    const size_t at = kv.head_block_offset(block_table[pos / kv.block_size], kv_head);
    const int slot = pos % kv.block_size;
    span.first[c] = pos;
    span.keys[c] = static_cast<const T*>(kv.k) + at + slot;
    span.values[c] = static_cast<const T*>(kv.v) + at + size_t(slot) * kv.head_dim;
    span.count[c] = std::min(kKeyChunk, num_keys - pos);
  }
  return span;
}

// The rows' attention against KV head kv_head of a sequence whose blocks are block_table.
using AttendFn = void (*)(const PagedKvLayer& kv, std::span<const int32_t> block_table, int kv_head,
                          float scale, const AttentionRow* rows, int num_rows);

// The vector kernels for kv's layout and element type, or nullptr where they do not apply: both
// take LLaMA's head sizes (64 and 128) and blocks of a multiple of 16 positions.
AttendFn avx512_attention_kernel(const PagedKvLayer& kv);
AttendFn avx2_attention_kernel(const PagedKvLayer& kv);

}  // namespace pipeline::cpu::detail
