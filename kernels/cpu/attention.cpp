// paged_attention: the loop over (sequence, KV head) and query chunks, the choice of kernel, and
// the generic kernel for any head size and block size. The vector kernels for LLaMA's head sizes
// are in attention_avx512.cpp and attention_avx2.cpp.
#include "kernels/cpu/attention.h"

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "kernels/cpu/attention_rows.h"
#include "kernels/cpu/fast_exp.h"

namespace pipeline::cpu {
namespace {

using detail::AttendFn;
using detail::AttentionRow;
using detail::kKeyChunk;
using detail::kMaxRows;
using detail::max_keys;
using detail::SoftmaxState;

// Queries of one (sequence, KV head) handled by one task in a long prefill.
constexpr int kQueryChunk = 16;

// A pool element as float: T is float, or uint16_t holding bf16 bits (kernels/cpu/paged_kv.h).
inline float widen(float x) {
  return x;
}
inline float widen(uint16_t bits) {
  return bf16_to_f32(bits);
}

// Each row's softmax(q · K[0..num_keys)ᵀ · scale) · V against KV head kv_head, any head_dim and
// block size, updating the softmax once per kKeyChunk keys. Always inlined into
// attend_generic_avx2/_portable below, so the loops vectorise for each.
template <class T>
[[gnu::always_inline]] inline void attend_generic(const PagedKvLayer& kv,
                                                  std::span<const int32_t> block_table, int kv_head,
                                                  float scale, const AttentionRow* rows,
                                                  int num_rows) {
  const int head_dim = kv.head_dim, block_size = kv.block_size;
  const int num_keys = max_keys(rows, num_rows);
  SoftmaxState state(num_rows, head_dim);
  for (int pos = 0; pos < num_keys;) {
    const int slot = pos % block_size;
    const int n = std::min({kKeyChunk, block_size - slot, num_keys - pos});
    const size_t at = kv.head_block_offset(block_table[pos / block_size], kv_head);
    // Key j, dimension d at keys[d·block_size + j]; value j, dimension d at values[j·head_dim + d].
    const T* keys = static_cast<const T*>(kv.k) + at + slot;
    const T* values = static_cast<const T*>(kv.v) + at + size_t(slot) * head_dim;
    for (int r = 0; r < num_rows; ++r) {
      // The chunk as a row that ends sooner sees it: its own last chunk is cut where it ends.
      const int live = std::min(n, rows[r].num_keys - pos);
      if (live <= 0) continue;
      const float* q = rows[r].q;
      float scores[kKeyChunk] = {};
      for (int d = 0; d < head_dim; ++d) {
        for (int j = 0; j < live; ++j) scores[j] += q[d] * widen(keys[size_t(d) * block_size + j]);
      }
      float chunk_max = -std::numeric_limits<float>::infinity();
      for (int j = 0; j < live; ++j) chunk_max = std::max(chunk_max, scores[j] *= scale);
      float correction;
      const float new_max = state.raise_max(r, chunk_max, correction);
      float* acc = state.acc + r * head_dim;
      for (int d = 0; d < head_dim; ++d) acc[d] *= correction;
      float chunk_sum = 0.0f;
      for (int j = 0; j < live; ++j) chunk_sum += scores[j] = fast_exp(scores[j] - new_max);
      state.sum[r] = state.sum[r] * correction + chunk_sum;
      for (int j = 0; j < live; ++j) {
        for (int d = 0; d < head_dim; ++d) acc[d] += scores[j] * widen(values[j * head_dim + d]);
      }
    }
    pos += n;
  }
  state.write(rows, num_rows, head_dim);
}

// Chosen at run time in attend_function rather than with GCC's target_clones, whose ifunc
// resolvers run before ThreadSanitizer's runtime is up and crash a -fsanitize=thread build.
template <class T>
__attribute__((target("avx2"))) void attend_generic_avx2(const PagedKvLayer& kv,
                                                         std::span<const int32_t> block_table,
                                                         int kv_head, float scale,
                                                         const AttentionRow* rows, int num_rows) {
  attend_generic<T>(kv, block_table, kv_head, scale, rows, num_rows);
}
template <class T>
void attend_generic_portable(const PagedKvLayer& kv, std::span<const int32_t> block_table,
                             int kv_head, float scale, const AttentionRow* rows, int num_rows) {
  attend_generic<T>(kv, block_table, kv_head, scale, rows, num_rows);
}
// The kernel paged_attention runs for this layout and element type on `isa`: the vector kernel
// of that instruction set (AVX-512 CPUs fall back to the AVX2 one) where it applies, else the
// generic kernel compiled for AVX2 or for any CPU.
AttendFn attend_function(const PagedKvLayer& kv, Isa isa) {
  require_isa(isa, "paged_attention");
  const bool avx512 = isa == Isa::Avx512 || isa == Isa::Avx512Bf16;
  if (avx512) {
    if (const AttendFn kernel = detail::avx512_attention_kernel(kv)) return kernel;
  }
  if (avx512 || isa == Isa::Avx2) {
    if (const AttendFn kernel = detail::avx2_attention_kernel(kv)) return kernel;
  }
  return with_element_type(kv, "paged_attention", [&](auto element) -> AttendFn {
    using T = decltype(element);
    return isa == Isa::Portable ? attend_generic_portable<T> : attend_generic_avx2<T>;
  });
}

}  // namespace

void paged_attention(const PagedKvLayer& kv, std::span<const AttentionSequence> seqs, int num_heads,
                     const float* q, size_t q_stride, float* out) {
  paged_attention(best_isa(), kv, seqs, num_heads, q, q_stride, out);
}

void paged_attention(Isa isa, const PagedKvLayer& kv, std::span<const AttentionSequence> seqs,
                     int num_heads, const float* q, size_t q_stride, float* out) {
  if (kv.head_dim <= 0 || kv.head_dim > kMaxAttentionHeadDim || kv.num_kv_heads <= 0 ||
      num_heads % kv.num_kv_heads != 0) {
    throw std::invalid_argument("paged_attention: head_dim " + std::to_string(kv.head_dim) +
                                " (max " + std::to_string(kMaxAttentionHeadDim) + ") or " +
                                std::to_string(num_heads) + " heads over " +
                                std::to_string(kv.num_kv_heads) + " KV heads not supported");
  }
  const int head_dim = kv.head_dim;
  const int group = num_heads / kv.num_kv_heads;
  const size_t out_stride = size_t(num_heads) * head_dim;
  const float scale = 1.0f / std::sqrt(float(head_dim));
  const AttendFn attend = attend_function(kv, isa);

  // The rows of queries [begin, end) of s for the query heads kv_head · group + g, g < group,
  // query by query, in passes of at most kMaxRows rows.
  const auto run_queries = [&](const AttentionSequence& s, int kv_head, int begin, int end) {
    AttentionRow rows[kMaxRows];
    int num_rows = 0;
    for (int i = begin; i < end; ++i) {
      const size_t row = size_t(s.first_row + i);
      for (int g = 0; g < group; ++g) {
        const size_t head_at = size_t(kv_head * group + g) * head_dim;
        rows[num_rows++] = {q + row * q_stride + head_at, out + row * out_stride + head_at,
                            s.start_pos + i + 1};
        if (num_rows == kMaxRows) {
          attend(kv, s.block_table, kv_head, scale, rows, num_rows);
          num_rows = 0;
        }
      }
    }
    if (num_rows > 0) attend(kv, s.block_table, kv_head, scale, rows, num_rows);
  };
  const int tasks = int(seqs.size()) * kv.num_kv_heads;
  tbb::parallel_for(0, tasks, [&](int task) {
    const AttentionSequence& s = seqs[task / kv.num_kv_heads];
    const int kv_head = task % kv.num_kv_heads;
    if (s.num_queries <= kQueryChunk) {
      run_queries(s, kv_head, 0, s.num_queries);
      return;
    }
    tbb::parallel_for(
        tbb::blocked_range<int>(0, s.num_queries, kQueryChunk),
        [&](const tbb::blocked_range<int>& r) { run_queries(s, kv_head, r.begin(), r.end()); });
  });
}

}  // namespace pipeline::cpu
