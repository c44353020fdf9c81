#include "kernels/cpu/attention.h"

#include <immintrin.h>
// GCC 12's AVX-512 intrinsics self-initialise their "undefined" operands (`__m512 __Y = __Y;`),
// which -Wuninitialized flags once inlined here (GCC bug 105593); the code itself is sound.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/fast_exp.h"

namespace pipeline::cpu {
namespace {

// Keys scored before the running softmax state is rescaled.
constexpr int kKeyChunk = 32;
// Queries of one (sequence, head) handled by one task in a long prefill.
constexpr int kQueryChunk = 16;

// Sixteen independent partial sums, so the compiler can vectorise without reassociating (two
// AVX2 registers). Always inlined, so it is compiled for its caller's target.
[[gnu::always_inline]] inline float dot(const float* a, const float* b, int n) {
  constexpr int kLanes = 16;
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

// out[0, head_dim) = softmax(q · K[0..num_keys)ᵀ · scale) · V for one query of one head, any
// head_dim. Always inlined into attend_generic_avx2/_portable below (the loops over head_dim
// vectorise for each); AVX-512 CPUs run attend_avx512 further down for LLaMA's head sizes.
[[gnu::always_inline]] inline void attend_generic(const PagedKvLayer& kv,
                                                  std::span<const int32_t> block_table, int kv_head,
                                                  int num_keys, float scale, const float* q,
                                                  float* out) {
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
    const float correction = fast_exp(running_max - new_max);  // ~0 on the first chunk
    running_sum *= correction;
    for (int d = 0; d < head_dim; ++d) acc[d] *= correction;
    for (int j = 0; j < n; ++j) scores[j] = fast_exp(scores[j] - new_max);
    for (int j = 0; j < n; ++j) {
      const float p = scores[j];
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

// Chosen at run time in attend_function rather than with GCC's target_clones, whose ifunc
// resolvers run before ThreadSanitizer's runtime is up and crash a -fsanitize=thread build.
__attribute__((target("avx2"))) void attend_generic_avx2(const PagedKvLayer& kv,
                                                         std::span<const int32_t> block_table,
                                                         int kv_head, int num_keys, float scale,
                                                         const float* q, float* out) {
  attend_generic(kv, block_table, kv_head, num_keys, scale, q, out);
}
void attend_generic_portable(const PagedKvLayer& kv, std::span<const int32_t> block_table,
                             int kv_head, int num_keys, float scale, const float* q, float* out) {
  attend_generic(kv, block_table, kv_head, num_keys, scale, q, out);
}

#define PIPELINE_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

// The same as attend_generic for head_dim = 16·NV, with q and the output accumulator held in
// NV registers each.
template <int NV>
PIPELINE_AVX512 void attend_avx512(const PagedKvLayer& kv, std::span<const int32_t> block_table,
                                   int kv_head, int num_keys, float scale, const float* q,
                                   float* out) {
  __m512 qv[NV], acc[NV];
  for (int v = 0; v < NV; ++v) {
    qv[v] = _mm512_loadu_ps(q + 16 * v);
    acc[v] = _mm512_setzero_ps();
  }
  alignas(64) float scores[kKeyChunk];
  const float* key_at[kKeyChunk];
  float running_max = -std::numeric_limits<float>::infinity();
  float running_sum = 0.0f;
  const size_t head_offset = size_t(kv_head) * kv.head_dim;

  for (int first = 0; first < num_keys; first += kKeyChunk) {
    const int n = std::min(kKeyChunk, num_keys - first);
    float chunk_max = -std::numeric_limits<float>::infinity();
    for (int j = 0; j < n; ++j) {
      const int pos = first + j;
      key_at[j] = kv.k + kv.slot_offset(block_table[pos / kv.block_size], pos % kv.block_size) +
                  head_offset;
      __m512 d = _mm512_mul_ps(qv[0], _mm512_loadu_ps(key_at[j]));
      for (int v = 1; v < NV; ++v)
        d = _mm512_fmadd_ps(qv[v], _mm512_loadu_ps(key_at[j] + 16 * v), d);
      scores[j] = _mm512_reduce_add_ps(d) * scale;
      chunk_max = std::max(chunk_max, scores[j]);
    }
    const float new_max = std::max(running_max, chunk_max);
    const float correction = fast_exp(running_max - new_max);  // ~0 on the first chunk
    running_sum *= correction;
    const __m512 c = _mm512_set1_ps(correction);
    for (int v = 0; v < NV; ++v) acc[v] = _mm512_mul_ps(acc[v], c);
    for (int j = 0; j < n; ++j) scores[j] = fast_exp(scores[j] - new_max);
    for (int j = 0; j < n; ++j) {
      running_sum += scores[j];
      const __m512 p = _mm512_set1_ps(scores[j]);
      // V sits at the same offset in kv.v as K in kv.k.
      const float* value = kv.v + (key_at[j] - kv.k);
      for (int v = 0; v < NV; ++v)
        acc[v] = _mm512_fmadd_ps(p, _mm512_loadu_ps(value + 16 * v), acc[v]);
    }
    running_max = new_max;
  }
  const __m512 inv_sum = _mm512_set1_ps(1.0f / running_sum);
  for (int v = 0; v < NV; ++v) _mm512_storeu_ps(out + 16 * v, _mm512_mul_ps(acc[v], inv_sum));
}

using AttendFn = void (*)(const PagedKvLayer&, std::span<const int32_t>, int, int, float,
                          const float*, float*);

// The fastest kernel for this head size on this CPU.
AttendFn attend_function(int head_dim) {
  static const bool avx512 = isa_supported(Isa::Avx512);
  if (avx512) {
    if (head_dim == 64) return attend_avx512<4>;
    if (head_dim == 128) return attend_avx512<8>;
  }
  static const bool avx2 = isa_supported(Isa::Avx2);
  return avx2 ? attend_generic_avx2 : attend_generic_portable;
}

}  // namespace

void paged_attention(const PagedKvLayer& kv, std::span<const AttentionSequence> seqs, int num_heads,
                     const float* q, size_t q_stride, float* out) {
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
  const AttendFn attend_one_query = attend_function(head_dim);

  const auto run_queries = [&](const AttentionSequence& s, int head, int begin, int end) {
    for (int i = begin; i < end; ++i) {
      const size_t row = size_t(s.first_row + i);
      const size_t head_at = size_t(head) * head_dim;
      attend_one_query(kv, s.block_table, head / group, s.start_pos + i + 1, scale,
                       q + row * q_stride + head_at, out + row * out_stride + head_at);
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
