#include "kernels/cpu/attention.h"

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace pipeline::cpu {
namespace {

// Keys scored before the running softmax state is rescaled.
constexpr int kKeyChunk = 32;
// Queries of one (sequence, head) handled by one task in a long prefill.
constexpr int kQueryChunk = 16;

// Eight independent partial sums, so the compiler can vectorise without reassociating.
float dot(const float* a, const float* b, int n) {
  constexpr int kLanes = 8;
  float lanes[kLanes] = {};
  int i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) lanes[l] += a[i + l] * b[i + l];
  }
  float sum = 0.0f;
  for (; i < n; ++i) sum += a[i] * b[i];
  for (int l = 0; l < kLanes; ++l) sum += lanes[l];
  return sum;
}

// out[0, head_dim) = softmax(q · K[0..num_keys)ᵀ · scale) · V for one query of one head.
void attend_one_query(const PagedKvLayer& kv, std::span<const int32_t> block_table, int kv_head,
                      int num_keys, float scale, const float* q, float* out) {
  const int head_dim = kv.head_dim;
  float acc[kMaxAttentionHeadDim];
  std::fill_n(acc, head_dim, 0.0f);
  float scores[kKeyChunk];
  const float* key_at[kKeyChunk];
  float running_max = -std::numeric_limits<float>::infinity();
  float running_sum = 0.0f;
  const size_t head_offset = size_t(kv_head) * head_dim;

  for (int first = 0; first < num_keys; first += kKeyChunk) {
    const int n = std::min(kKeyChunk, num_keys - first);
    float chunk_max = -std::numeric_limits<float>::infinity();
    for (int j = 0; j < n; ++j) {
      const int pos = first + j;
      key_at[j] = kv.k + kv.slot_offset(block_table[pos / kv.block_size], pos % kv.block_size) +
                  head_offset;
      scores[j] = dot(q, key_at[j], head_dim) * scale;
      chunk_max = std::max(chunk_max, scores[j]);
    }
    const float new_max = std::max(running_max, chunk_max);
    const float correction = std::exp(running_max - new_max);  // 0 on the first chunk
    running_sum *= correction;
    for (int d = 0; d < head_dim; ++d) acc[d] *= correction;
    for (int j = 0; j < n; ++j) {
      const float p = std::exp(scores[j] - new_max);
      running_sum += p;
      // V sits at the same offset in kv.v as K in kv.k.
      const float* value = kv.v + (key_at[j] - kv.k);
      for (int d = 0; d < head_dim; ++d) acc[d] += p * value[d];
    }
    running_max = new_max;
  }
  const float inv_sum = 1.0f / running_sum;
  for (int d = 0; d < head_dim; ++d) out[d] = acc[d] * inv_sum;
}

}  // namespace

void paged_attention(const PagedKvLayer& kv, std::span<const AttentionSequence> seqs, int num_heads,
                     const float* q, float* out) {
  if (kv.head_dim <= 0 || kv.head_dim > kMaxAttentionHeadDim || kv.num_kv_heads <= 0 ||
      num_heads % kv.num_kv_heads != 0) {
    throw std::invalid_argument("paged_attention: head_dim " + std::to_string(kv.head_dim) +
                                " (max " + std::to_string(kMaxAttentionHeadDim) + ") or " +
                                std::to_string(num_heads) + " heads over " +
                                std::to_string(kv.num_kv_heads) + " KV heads not supported");
  }
  const int head_dim = kv.head_dim;
  const int group = num_heads / kv.num_kv_heads;
  const size_t row_stride = size_t(num_heads) * head_dim;
  const float scale = 1.0f / std::sqrt(float(head_dim));

  const auto run_queries = [&](const AttentionSequence& s, int head, int begin, int end) {
    for (int i = begin; i < end; ++i) {
      const size_t at = size_t(s.first_row + i) * row_stride + size_t(head) * head_dim;
      attend_one_query(kv, s.block_table, head / group, s.start_pos + i + 1, scale, q + at,
                       out + at);
    }
  };
  const int tasks = int(seqs.size()) * num_heads;
  tbb::parallel_for(0, tasks, [&](int task) {
    const AttentionSequence& s = seqs[task / num_heads];
    const int head = task % num_heads;
    if (s.num_queries <= kQueryChunk) {
      run_queries(s, head, 0, s.num_queries);
      return;
    }
    tbb::parallel_for(
        tbb::blocked_range<int>(0, s.num_queries, kQueryChunk),
        [&](const tbb::blocked_range<int>& r) { run_queries(s, head, r.begin(), r.end()); });
  });
}

}  // namespace pipeline::cpu
