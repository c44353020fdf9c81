// Causal grouped-query attention that reads keys and values straight from the paged KV pool
// through each sequence's block table. The same kernel serves prefill (many queries per
// sequence, each seeing the positions up to its own) and decode (one query per sequence).
// Softmax is online (running max and sum, rescaled once per chunk of keys); the arithmetic is
// float32 whatever the pool's element type (float32 or bf16 keys and values are widened as read).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/paged_kv.h"

namespace pipeline::cpu {

// The longest head this kernel accepts (its per-query accumulator lives on the stack).
constexpr int kMaxAttentionHeadDim = 512;

// One sequence's queries: rows [first_row, first_row + num_queries) of q and out, at positions
// start_pos, start_pos + 1, ...; query i attends to positions [0, start_pos + i], whose K/V
// must already be in the pool.
struct AttentionSequence {
  int first_row = 0;
  int num_queries = 0;
  int32_t start_pos = 0;
  std::span<const int32_t> block_table;
};

// q: [rows, q_stride], the heads in each row's first num_heads · head_dim floats (so q can be
// a slice of the fused q/k/v projection's output); out: [rows, num_heads · head_dim]. Query head
// h reads KV head h / (num_heads / num_kv_heads). Scores are scaled by 1/sqrt(head_dim).
// Parallel over (sequence, KV head) and, for long prompts, over chunks of queries. Up to 16
// rows that share a KV head (a query head at one position: the heads of a GQA group and, in a
// prefill, consecutive queries) are attended in one pass over its keys and values, which are
// then read once for all of them; a row's result is the same whatever rows share its pass.
void paged_attention(const PagedKvLayer& kv, std::span<const AttentionSequence> seqs, int num_heads,
                     const float* q, size_t q_stride, float* out);
// The same with the kernels of a chosen instruction set (which must be supported), for tests and
// benchmarks; the one above runs best_isa()'s. Each instruction set sums in its own order, so
// their results differ in the last bits.
void paged_attention(Isa isa, const PagedKvLayer& kv, std::span<const AttentionSequence> seqs,
                     int num_heads, const float* q, size_t q_stride, float* out);

}  // namespace pipeline::cpu
