// What paged_attention's kernels share (kernels/cpu/attention*.cpp): the rows one pass over a KV
// head attends, their online-softmax state, where a span of a sequence's keys lies in the pool,
// and the vector kernels' walk over those spans. Each kernel computes, for every row, softmax(q ·
// K[0..num_keys)ᵀ · scale) · V; they differ only in the vector instructions they use and in the
// order of their float32 sums.
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

// Where the keys (field = &SpanChunks<T>::keys) or values (&SpanChunks<T>::values) read after
// chunk c of span start: chunk c + 1's, or the next span's first (null at the end). The vector
// kernels ask for them line by line while chunk c is read: each (block, KV head) holds only
// 2–4 KiB of keys and as much of values, anywhere in the pool, and the hardware prefetcher
// barely starts on one before it ends.
template <class T>
const char* read_after(const SpanChunks<T>& span, const SpanChunks<T>& next,
                       const T* const (SpanChunks<T>::*field)[SpanChunks<T>::kMax], int c) {
  if (c + 1 < span.chunks) return reinterpret_cast<const char*>((span.*field)[c + 1]);
  return next.chunks > 0 ? reinterpret_cast<const char*>((next.*field)[0]) : nullptr;
}

// A vector kernel's walk over a sequence's keys. Kernel is a type with
//   using Element = T;  (the pool's element type)
//   static constexpr int kHeadDim, kRowsTogether;
//   template <int R> static void span(const SpanChunks<T>& span, const SpanChunks<T>& next,
//                                     int block_size, float scale, const AttentionRow* rows,
//                                     SoftmaxState& state, int r0);
// which folds one span into the softmax state of rows r0 .. r0 + R - 1, asking for `next` while
// it reads `span`.

// Kernel::span<n> for a run-time n in [1, R].
template <class Kernel, int R>
void attend_span_of(int n, const SpanChunks<typename Kernel::Element>& span,
                    const SpanChunks<typename Kernel::Element>& next, int block_size, float scale,
                    const AttentionRow* rows, SoftmaxState& state, int r0) {
  if constexpr (R > 0) {
    if (n == R) return Kernel::template span<R>(span, next, block_size, scale, rows, state, r0);
    attend_span_of<Kernel, R - 1>(n, span, next, block_size, scale, rows, state, r0);
  }
}

// The rows against KV head kv_head, span by span, Kernel::kRowsTogether rows at a time; the first
// rows' pass over a span asks for the next one, the others find it on its way.
template <class Kernel>
void attend_by_spans(const PagedKvLayer& kv, std::span<const int32_t> block_table, int kv_head,
                     float scale, const AttentionRow* rows, int num_rows) {
  using T = typename Kernel::Element;
  const int num_keys = max_keys(rows, num_rows);
  SoftmaxState state(num_rows, Kernel::kHeadDim);
  SpanChunks<T> span = span_at<T>(kv, block_table, kv_head, 0, num_keys);
  for (int first = 0; first < num_keys; first += kKeySpan) {
    const SpanChunks<T> next = span_at<T>(kv, block_table, kv_head, first + kKeySpan, num_keys);
    for (int r0 = 0; r0 < num_rows; r0 += Kernel::kRowsTogether) {
      attend_span_of<Kernel, Kernel::kRowsTogether>(std::min(Kernel::kRowsTogether, num_rows - r0),
                                                    span, r0 == 0 ? next : SpanChunks<T>{},
                                                    kv.block_size, scale, rows + r0, state, r0);
    }
    span = next;
  }
  state.write(rows, num_rows, Kernel::kHeadDim);
}

// The rows' attention against KV head kv_head of a sequence whose blocks are block_table.
using AttendFn = void (*)(const PagedKvLayer& kv, std::span<const int32_t> block_table, int kv_head,
                          float scale, const AttentionRow* rows, int num_rows);

// The vector kernels for kv's layout and element type, or nullptr where they do not apply: both
// take LLaMA's head sizes (64 and 128) and blocks of a multiple of 16 positions.
AttendFn avx512_attention_kernel(const PagedKvLayer& kv);
AttendFn avx2_attention_kernel(const PagedKvLayer& kv);

}  // namespace pipeline::cpu::detail
