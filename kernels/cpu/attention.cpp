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

// Keys scored per online-softmax update: one AVX-512 vector of scores.
constexpr int kKeyChunk = 16;
// Query heads that share a KV head and are attended in one pass over its keys and values, which
// are then read from memory once for all of them (a whole GQA group up to this size).
constexpr int kMaxHeadsPerPass = 8;
// Queries of one (sequence, KV head) handled by one task in a long prefill.
constexpr int kQueryChunk = 16;

// The online softmax of `heads` query heads, each over the keys seen so far: running max, sum
// of exp(score - max), and the values weighted by the same (acc, head_dim floats a head).
struct SoftmaxState {
  float max[kMaxHeadsPerPass];
  float sum[kMaxHeadsPerPass];
  alignas(64) float acc[kMaxHeadsPerPass * kMaxAttentionHeadDim];

  SoftmaxState(int heads, int head_dim) {
    std::fill_n(max, heads, -std::numeric_limits<float>::infinity());
    std::fill_n(sum, heads, 0.0f);
    std::fill_n(acc, heads * head_dim, 0.0f);
  }

  // Folds in a chunk whose largest scaled score is chunk_max; returns the chunk's new max and
  // sets `correction`, the factor the head's sum and acc must be rescaled by.
  float raise_max(int head, float chunk_max, float& correction) {
    const float new_max = std::max(max[head], chunk_max);
    correction = fast_exp(max[head] - new_max);  // ~0 on the first chunk
    max[head] = new_max;
    return new_max;
  }

  void write(int heads, int head_dim, float* out) const {
    for (int h = 0; h < heads; ++h) {
      const float inv_sum = 1.0f / sum[h];
      for (int d = 0; d < head_dim; ++d) out[h * head_dim + d] = acc[h * head_dim + d] * inv_sum;
    }
  }
};

// out[h] = softmax(q[h] · K[0..num_keys)ᵀ · scale) · V for query heads h < heads (rows of
// head_dim floats in q and out) against KV head kv_head, any head_dim and block size. Always
// inlined into attend_generic_avx2/_portable below, so the loops vectorise for each; AVX-512 CPUs
// run attend_avx512 further down for LLaMA's head sizes.
[[gnu::always_inline]] inline void attend_generic(const PagedKvLayer& kv,
                                                  std::span<const int32_t> block_table, int kv_head,
                                                  int num_keys, float scale, const float* q,
                                                  int heads, float* out) {
  const int head_dim = kv.head_dim, block_size = kv.block_size;
  SoftmaxState state(heads, head_dim);
  for (int pos = 0; pos < num_keys;) {
    const int slot = pos % block_size;
    const int n = std::min({kKeyChunk, block_size - slot, num_keys - pos});
    const size_t at = kv.head_block_offset(block_table[pos / block_size], kv_head);
    const float* keys = kv.k + at + slot;                       // key j, dim d: d·block_size + j
    const float* values = kv.v + at + size_t(slot) * head_dim;  // value j, dim d: j·head_dim + d
    for (int h = 0; h < heads; ++h) {
      const float* qh = q + size_t(h) * head_dim;
      float scores[kKeyChunk] = {};
      for (int d = 0; d < head_dim; ++d) {
        for (int j = 0; j < n; ++j) scores[j] += qh[d] * keys[size_t(d) * block_size + j];
      }
      float chunk_max = -std::numeric_limits<float>::infinity();
      for (int j = 0; j < n; ++j) chunk_max = std::max(chunk_max, scores[j] *= scale);
      float correction;
      const float new_max = state.raise_max(h, chunk_max, correction);
      float* acc = state.acc + h * head_dim;
      for (int d = 0; d < head_dim; ++d) acc[d] *= correction;
      float chunk_sum = 0.0f;
      for (int j = 0; j < n; ++j) chunk_sum += scores[j] = fast_exp(scores[j] - new_max);
      state.sum[h] = state.sum[h] * correction + chunk_sum;
      for (int j = 0; j < n; ++j) {
        for (int d = 0; d < head_dim; ++d) acc[d] += scores[j] * values[j * head_dim + d];
      }
    }
    pos += n;
  }
  state.write(heads, head_dim, out);
}

// Chosen at run time in attend_function rather than with GCC's target_clones, whose ifunc
// resolvers run before ThreadSanitizer's runtime is up and crash a -fsanitize=thread build.
__attribute__((target("avx2"))) void attend_generic_avx2(const PagedKvLayer& kv,
                                                         std::span<const int32_t> block_table,
                                                         int kv_head, int num_keys, float scale,
                                                         const float* q, int heads, float* out) {
  attend_generic(kv, block_table, kv_head, num_keys, scale, q, heads, out);
}
void attend_generic_portable(const PagedKvLayer& kv, std::span<const int32_t> block_table,
                             int kv_head, int num_keys, float scale, const float* q, int heads,
                             float* out) {
  attend_generic(kv, block_table, kv_head, num_keys, scale, q, heads, out);
}

#define PIPELINE_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

// Keys the AVX-512 kernel scores before it rescales the softmax state and sums their values:
// four vectors of scores, so the reductions and the rescale come once per 64 keys, and a
// span's keys and values (32 KiB at head_dim 64) stay in L1 for the other heads of the group.
constexpr int kKeySpan = 64;

// The same as attend_generic for head_dim = 16·NV and a block size that is a multiple of 16.
// Scores come 16 keys at a time: per dimension d one FMA of q[d] by the keys' row d (the
// transposed K layout), in four chains; keys past num_keys are masked off, never read. Values
// are summed in two interleaved sets of accumulators, halving the FMA dependency chain.
template <int NV>
PIPELINE_AVX512 void attend_avx512(const PagedKvLayer& kv, std::span<const int32_t> block_table,
                                   int kv_head, int num_keys, float scale, const float* q,
                                   int heads, float* out) {
  constexpr int kHeadDim = 16 * NV;
  const int block_size = kv.block_size;
  SoftmaxState state(heads, kHeadDim);
  alignas(64) float weights[kKeySpan];
  const float* values_at[kKeySpan / kKeyChunk];
  for (int span = 0; span < num_keys; span += kKeySpan) {
    const int span_keys = std::min(kKeySpan, num_keys - span);
    const int chunks = (span_keys + kKeyChunk - 1) / kKeyChunk;
    for (int h = 0; h < heads; ++h) {
      const float* qh = q + size_t(h) * kHeadDim;
      __m512 span_max = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
      for (int c = 0; c < chunks; ++c) {
        const int pos = span + c * kKeyChunk;
        const __mmask16 live = __mmask16((1u << std::min(kKeyChunk, num_keys - pos)) - 1);
        const size_t at = kv.head_block_offset(block_table[pos / block_size], kv_head);
        const int slot = pos % block_size;
        const float* keys = kv.k + at + slot;
        values_at[c] = kv.v + at + size_t(slot) * kHeadDim;
        __m512 partial[4];
        for (__m512& p : partial) p = _mm512_setzero_ps();
        for (int d = 0; d < kHeadDim; d += 4) {
          for (int u = 0; u < 4; ++u) {
            const __m512 key_row = _mm512_maskz_loadu_ps(live, keys + size_t(d + u) * block_size);
            partial[u] = _mm512_fmadd_ps(_mm512_set1_ps(qh[d + u]), key_row, partial[u]);
          }
        }
        const __m512 scores =
            _mm512_mask_blend_ps(live, _mm512_set1_ps(-std::numeric_limits<float>::infinity()),
                                 _mm512_mul_ps(_mm512_add_ps(_mm512_add_ps(partial[0], partial[1]),
                                                             _mm512_add_ps(partial[2], partial[3])),
                                               _mm512_set1_ps(scale)));
        span_max = _mm512_max_ps(span_max, scores);
        _mm512_store_ps(weights + c * kKeyChunk, scores);
      }
      float correction;
      const float new_max = state.raise_max(h, _mm512_reduce_max_ps(span_max), correction);
      // exp(-inf) comes out of fast_exp as ~1e-38, not 0, so masked keys are zeroed.
      for (int i = 0; i < chunks * kKeyChunk; ++i) weights[i] = fast_exp(weights[i] - new_max);
      __m512 sum = _mm512_setzero_ps();
      for (int c = 0; c < chunks; ++c) {
        const __mmask16 live =
            __mmask16((1u << std::min(kKeyChunk, span_keys - c * kKeyChunk)) - 1);
        const __m512 w = _mm512_maskz_loadu_ps(live, weights + c * kKeyChunk);
        sum = _mm512_add_ps(sum, w);
      }
      state.sum[h] = state.sum[h] * correction + _mm512_reduce_add_ps(sum);

      float* acc_h = state.acc + h * kHeadDim;
      __m512 even[NV], odd[NV];  // keys 2i and 2i + 1 of each chunk
      const __m512 c = _mm512_set1_ps(correction);
      for (int v = 0; v < NV; ++v) {
        even[v] = _mm512_mul_ps(_mm512_load_ps(acc_h + 16 * v), c);
        odd[v] = _mm512_setzero_ps();
      }
      for (int chunk = 0; chunk < chunks; ++chunk) {
        const int n = std::min(kKeyChunk, span_keys - chunk * kKeyChunk);
        const float* value = values_at[chunk];
        const float* w = weights + chunk * kKeyChunk;
        int j = 0;
        for (; j + 2 <= n; j += 2) {
          const __m512 w0 = _mm512_set1_ps(w[j]), w1 = _mm512_set1_ps(w[j + 1]);
          for (int v = 0; v < NV; ++v) {
            even[v] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(value + j * kHeadDim + 16 * v), even[v]);
            odd[v] =
                _mm512_fmadd_ps(w1, _mm512_loadu_ps(value + (j + 1) * kHeadDim + 16 * v), odd[v]);
          }
        }
        if (j < n) {
          const __m512 w0 = _mm512_set1_ps(w[j]);
          for (int v = 0; v < NV; ++v)
            even[v] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(value + j * kHeadDim + 16 * v), even[v]);
        }
      }
      for (int v = 0; v < NV; ++v) _mm512_store_ps(acc_h + 16 * v, _mm512_add_ps(even[v], odd[v]));
    }
  }
  state.write(heads, kHeadDim, out);
}

using AttendFn = void (*)(const PagedKvLayer&, std::span<const int32_t>, int, int, float,
                          const float*, int, float*);

// The fastest kernel for this layout on this CPU.
AttendFn attend_function(const PagedKvLayer& kv) {
  static const bool avx512 = isa_supported(Isa::Avx512);
  if (avx512 && kv.block_size % kKeyChunk == 0) {
    if (kv.head_dim == 64) return attend_avx512<4>;
    if (kv.head_dim == 128) return attend_avx512<8>;
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
  const AttendFn attend = attend_function(kv);

  // Query heads kv_head · group + g of each query row, g < group, in passes of at most
  // kMaxHeadsPerPass heads.
  const auto run_queries = [&](const AttentionSequence& s, int kv_head, int begin, int end) {
    for (int i = begin; i < end; ++i) {
      const size_t row = size_t(s.first_row + i);
      for (int first = 0; first < group; first += kMaxHeadsPerPass) {
        const size_t head_at = size_t(kv_head * group + first) * head_dim;
        attend(kv, s.block_table, kv_head, s.start_pos + i + 1, scale, q + row * q_stride + head_at,
               std::min(kMaxHeadsPerPass, group - first), out + row * out_stride + head_at);
      }
    }
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
