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

// Keys scored together: one AVX-512 vector of scores, and the generic kernel's step between
// online-softmax updates (the AVX-512 kernel updates once per kKeySpan keys).
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

// A pool element as float: T is float, or uint16_t holding bf16 bits (kernels/cpu/paged_kv.h).
inline float widen(float x) {
  return x;
}
inline float widen(uint16_t bits) {
  return bf16_to_f32(bits);
}

// out[h] = softmax(q[h] · K[0..num_keys)ᵀ · scale) · V for query heads h < heads (rows of
// head_dim floats in q and out) against KV head kv_head, any head_dim and block size. Always
// inlined into attend_generic_avx2/_portable below, so the loops vectorise for each; AVX-512 CPUs
// run attend_avx512 further down for LLaMA's head sizes.
template <class T>
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
    // Key j, dimension d at keys[d·block_size + j]; value j, dimension d at values[j·head_dim + d].
    const T* keys = static_cast<const T*>(kv.k) + at + slot;
    const T* values = static_cast<const T*>(kv.v) + at + size_t(slot) * head_dim;
    for (int h = 0; h < heads; ++h) {
      const float* qh = q + size_t(h) * head_dim;
      float scores[kKeyChunk] = {};
      for (int d = 0; d < head_dim; ++d) {
        for (int j = 0; j < n; ++j) scores[j] += qh[d] * widen(keys[size_t(d) * block_size + j]);
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
        for (int d = 0; d < head_dim; ++d) acc[d] += scores[j] * widen(values[j * head_dim + d]);
      }
    }
    pos += n;
  }
  state.write(heads, head_dim, out);
}

// Chosen at run time in attend_function rather than with GCC's target_clones, whose ifunc
// resolvers run before ThreadSanitizer's runtime is up and crash a -fsanitize=thread build.
template <class T>
__attribute__((target("avx2"))) void attend_generic_avx2(const PagedKvLayer& kv,
                                                         std::span<const int32_t> block_table,
                                                         int kv_head, int num_keys, float scale,
                                                         const float* q, int heads, float* out) {
  attend_generic<T>(kv, block_table, kv_head, num_keys, scale, q, heads, out);
}
template <class T>
void attend_generic_portable(const PagedKvLayer& kv, std::span<const int32_t> block_table,
                             int kv_head, int num_keys, float scale, const float* q, int heads,
                             float* out) {
  attend_generic<T>(kv, block_table, kv_head, num_keys, scale, q, heads, out);
}

#define PIPELINE_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

// Keys the AVX-512 kernel scores before it rescales the softmax state and sums their values:
// four vectors of scores, so the reductions and the rescale come once per 64 keys, and a
// span's keys and values (32 KiB at head_dim 64) stay in L1 for the other heads of the group.
constexpr int kKeySpan = 64;

// Sixteen pool elements from p as floats, all of them or the lanes in `live` (the others 0,
// never read).
PIPELINE_AVX512 inline __m512 load16(const float* p) {
  return _mm512_loadu_ps(p);
}
PIPELINE_AVX512 inline __m512 load16(const uint16_t* p) {
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}
PIPELINE_AVX512 inline __m512 load16(__mmask16 live, const float* p) {
  return _mm512_maskz_loadu_ps(live, p);
}
PIPELINE_AVX512 inline __m512 load16(__mmask16 live, const uint16_t* p) {
  const __m256i bits = _mm256_maskz_loadu_epi16(live, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

// Where the AVX-512 kernel finds a span's keys: per chunk of 16 positions, the start of its
// key rows (key j, dimension d at keys + d · block_size + j) and of its values (value j at
// values + j · head_dim), how many keys it holds, and the mask of those lanes.
template <class T>
struct SpanChunks {
  static constexpr int kMax = kKeySpan / kKeyChunk;
  int chunks = 0;
  const T* keys[kMax];
  const T* values[kMax];
  int count[kMax];
  __mmask16 live[kMax];
};

// acc[h] += w[h][j] · value row j for each of H heads: the row is loaded once for all of them.
template <int NV, int H, class T>
PIPELINE_AVX512 inline void add_value_row(const T* values, const float* const* w, int j,
                                          __m512 (&acc)[H][NV]) {
  __m512 row[NV];
  for (int v = 0; v < NV; ++v) row[v] = load16(values + j * 16 * NV + 16 * v);
  for (int h = 0; h < H; ++h) {
    const __m512 weight = _mm512_set1_ps(w[h][j]);
    for (int v = 0; v < NV; ++v) acc[h][v] = _mm512_fmadd_ps(weight, row[v], acc[h][v]);
  }
}

// Query heads h0 .. h0 + H - 1 (rows of 16·NV floats at q) against one span: scores 16 keys per
// vector, one FMA per dimension by the keys' row d (the transposed K layout) and per head, so
// each key row and each value row is loaded once for all H heads; keys past the span's end are
// masked off, never read. A single head gets more independent FMA chains instead (four for the
// scores, two sets of value accumulators), so its dependency chains do not bound it.
template <int NV, int H, class T>
PIPELINE_AVX512 void attend_span(const SpanChunks<T>& span, int block_size, float scale,
                                 const float* q, SoftmaxState& state, int h0) {
  constexpr int kHeadDim = 16 * NV;
  constexpr int kChains = H == 1 ? 4 : 2;
  constexpr int kSets = H == 1 ? 2 : 1;
  alignas(64) float weights[H][kKeySpan];
  __m512 span_max[H];
  for (int h = 0; h < H; ++h) span_max[h] = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int c = 0; c < span.chunks; ++c) {
    __m512 acc[H][kChains];
    for (int h = 0; h < H; ++h)
      for (int u = 0; u < kChains; ++u) acc[h][u] = _mm512_setzero_ps();
    for (int d = 0; d < kHeadDim; d += kChains) {
      for (int u = 0; u < kChains; ++u) {
        const __m512 key_row = load16(span.live[c], span.keys[c] + size_t(d + u) * block_size);
        for (int h = 0; h < H; ++h)
          acc[h][u] = _mm512_fmadd_ps(_mm512_set1_ps(q[h * kHeadDim + d + u]), key_row, acc[h][u]);
      }
    }
    for (int h = 0; h < H; ++h) {
      __m512 dot = acc[h][0];
      for (int u = 1; u < kChains; ++u) dot = _mm512_add_ps(dot, acc[h][u]);
      const __m512 scores = _mm512_mask_blend_ps(
          span.live[c], _mm512_set1_ps(-std::numeric_limits<float>::infinity()),
          _mm512_mul_ps(dot, _mm512_set1_ps(scale)));
      span_max[h] = _mm512_max_ps(span_max[h], scores);
      _mm512_store_ps(weights[h] + c * kKeyChunk, scores);
    }
  }

  __m512 acc[kSets][H][NV];
  for (int h = 0; h < H; ++h) {
    float correction;
    const float new_max = state.raise_max(h0 + h, _mm512_reduce_max_ps(span_max[h]), correction);
    // exp(-inf) comes out of fast_exp as ~1e-38, not 0, so masked keys are zeroed.
    for (int i = 0; i < span.chunks * kKeyChunk; ++i)
      weights[h][i] = fast_exp(weights[h][i] - new_max);
    __m512 sum = _mm512_setzero_ps();
    for (int c = 0; c < span.chunks; ++c)
      sum = _mm512_add_ps(sum, _mm512_maskz_loadu_ps(span.live[c], weights[h] + c * kKeyChunk));
    state.sum[h0 + h] = state.sum[h0 + h] * correction + _mm512_reduce_add_ps(sum);
    const float* acc_h = state.acc + (h0 + h) * kHeadDim;
    for (int v = 0; v < NV; ++v) {
      acc[0][h][v] = _mm512_mul_ps(_mm512_load_ps(acc_h + 16 * v), _mm512_set1_ps(correction));
      for (int s = 1; s < kSets; ++s) acc[s][h][v] = _mm512_setzero_ps();
    }
  }
  for (int c = 0; c < span.chunks; ++c) {
    const float* w[H];
    for (int h = 0; h < H; ++h) w[h] = weights[h] + c * kKeyChunk;
    int j = 0;
    for (; j + kSets <= span.count[c]; j += kSets) {
      for (int s = 0; s < kSets; ++s) add_value_row<NV, H>(span.values[c], w, j + s, acc[s]);
    }
    for (; j < span.count[c]; ++j) add_value_row<NV, H>(span.values[c], w, j, acc[0]);
  }
  for (int h = 0; h < H; ++h) {
    float* acc_h = state.acc + (h0 + h) * kHeadDim;
    for (int v = 0; v < NV; ++v) {
      __m512 total = acc[0][h][v];
      for (int s = 1; s < kSets; ++s) total = _mm512_add_ps(total, acc[s][h][v]);
      _mm512_store_ps(acc_h + 16 * v, total);
    }
  }
}

// attend_span<NV, n> for a run-time n in [1, H].
template <int NV, int H, class T>
PIPELINE_AVX512 void attend_span_of(int n, const SpanChunks<T>& span, int block_size, float scale,
                                    const float* q, SoftmaxState& state, int h0) {
  if constexpr (H > 0) {
    if (n == H) return attend_span<NV, H>(span, block_size, scale, q, state, h0);
    attend_span_of<NV, H - 1>(n, span, block_size, scale, q, state, h0);
  }
}

// The same as attend_generic for head_dim = 16·NV and a block size that is a multiple of 16:
// span by span, the heads in groups of up to four (two at head_dim 128, for the registers).
template <int NV, class T>
PIPELINE_AVX512 void attend_avx512(const PagedKvLayer& kv, std::span<const int32_t> block_table,
                                   int kv_head, int num_keys, float scale, const float* q,
                                   int heads, float* out) {
  constexpr int kHeadDim = 16 * NV;
  constexpr int kHeadsTogether = NV <= 4 ? 4 : 2;
  const int block_size = kv.block_size;
  SoftmaxState state(heads, kHeadDim);
  for (int first = 0; first < num_keys; first += kKeySpan) {
    SpanChunks<T> span;
    for (int pos = first; pos < std::min(num_keys, first + kKeySpan); pos += kKeyChunk) {
      const int c = span.chunks++;
      const size_t at = kv.head_block_offset(block_table[pos / block_size], kv_head);
      const int slot = pos % block_size;
      span.keys[c] = static_cast<const T*>(kv.k) + at + slot;
      span.values[c] = static_cast<const T*>(kv.v) + at + size_t(slot) * kHeadDim;
      span.count[c] = std::min(kKeyChunk, num_keys - pos);
      span.live[c] = __mmask16((1u << span.count[c]) - 1);
    }
    for (int h0 = 0; h0 < heads; h0 += kHeadsTogether) {
      attend_span_of<NV, kHeadsTogether>(std::min(kHeadsTogether, heads - h0), span, block_size,
                                         scale, q + size_t(h0) * kHeadDim, state, h0);
    }
  }
  state.write(heads, kHeadDim, out);
}

using AttendFn = void (*)(const PagedKvLayer&, std::span<const int32_t>, int, int, float,
                          const float*, int, float*);

// The fastest kernel for this layout and element type on this CPU.
template <class T>
AttendFn attend_function_for(const PagedKvLayer& kv) {
  static const bool avx512 = isa_supported(Isa::Avx512);
  if (avx512 && kv.block_size % kKeyChunk == 0) {
    if (kv.head_dim == 64) return attend_avx512<4, T>;
    if (kv.head_dim == 128) return attend_avx512<8, T>;
  }
  static const bool avx2 = isa_supported(Isa::Avx2);
  return avx2 ? attend_generic_avx2<T> : attend_generic_portable<T>;
}

AttendFn attend_function(const PagedKvLayer& kv) {
  return with_element_type(kv, "paged_attention", [&](auto element) {
    return attend_function_for<decltype(element)>(kv);
  });
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
