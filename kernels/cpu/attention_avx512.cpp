// The AVX-512 attention kernel for LLaMA's head sizes (64 and 128) and blocks of a multiple of
// 16 positions: 16 keys per vector of scores, up to four rows scored and weighed together, each
// span's keys and values asked for while the one before it is read.
#include <immintrin.h>
// GCC 12's AVX-512 intrinsics self-initialise their "undefined" operands (`__m512 __Y = __Y;`),
// which -Wuninitialized flags once inlined here (GCC bug 105593); the code itself is sound.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>

#include "kernels/cpu/attention_rows.h"
#include "kernels/cpu/fast_exp.h"

namespace pipeline::cpu::detail {
namespace {

#define PIPELINE_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

// Independent FMA chains per row for the scores (by dimension), so a row's dependency chains
// stay short of the FMA latency. Fixed, whatever the number of rows, so that a row's sums come
// in the same order in any pass. (Its weighted values are summed key by key in one chain per
// vector of the head.)
constexpr int kScoreChains = 4;

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

// The lanes of the first n keys of a chunk (none for n <= 0, all for n >= 16).
inline __mmask16 first_keys(int n) {
  return n >= kKeyChunk ? __mmask16(0xffff) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
}

// acc[r] += w[r][j] · value row j (16·VS floats at `row`) for each of R rows: the row is loaded
// once for all of them.
template <int VS, int R, class T>
PIPELINE_AVX512 inline void add_value_row(const T* row, const float* const* w, int j,
                                          __m512 (&acc)[R][VS]) {
  __m512 value[VS];
  for (int v = 0; v < VS; ++v) value[v] = load16(row + 16 * v);
  for (int r = 0; r < R; ++r) {
    const __m512 weight = _mm512_set1_ps(w[r][j]);
    for (int v = 0; v < VS; ++v) acc[r][v] = _mm512_fmadd_ps(weight, value[v], acc[r][v]);
  }
}

// Rows r0 .. r0 + R - 1 (head_dim = 16·NV) against one span: scores 16 keys per vector, one FMA
// per dimension by the keys' row d (the transposed K layout) and per row, so each key row is
// loaded once for all R rows; keys past the span's end are masked off, never read, and keys past
// a row's own end score -inf and weigh exactly 0. The weighted values are summed a slice of the
// head at a time, as many vectors as keep R·slice accumulators (at most 16) in registers.
template <int NV, int R, class T>
PIPELINE_AVX512 void attend_span(const SpanChunks<T>& span, const SpanChunks<T>& next,
                                 int block_size, float scale, const AttentionRow* rows,
                                 SoftmaxState& state, int r0) {
  constexpr int kHeadDim = 16 * NV;
  constexpr int kSlice = std::min(NV, int(std::bit_floor(unsigned(16 / R))));
  static_assert(NV % kSlice == 0);
  __mmask16 live[R][SpanChunks<T>::kMax];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < span.chunks; ++c)
      live[r][c] = first_keys(std::min(span.count[c], rows[r].num_keys - span.first[c]));

  alignas(64) float weights[R][kKeySpan];
  __m512 span_max[R];
  for (int r = 0; r < R; ++r) span_max[r] = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int c = 0; c < span.chunks; ++c) {
    __m512 acc[R][kScoreChains];
    for (int r = 0; r < R; ++r)
      for (int u = 0; u < kScoreChains; ++u) acc[r][u] = _mm512_setzero_ps();
    const char* next_keys = read_after(span, next, &SpanChunks<T>::keys, c);
    const __mmask16 in_span = first_keys(span.count[c]);
    for (int d = 0; d < kHeadDim; d += kScoreChains) {
      if (next_keys) {
        for (int u = 0; u < kScoreChains; ++u)
          _mm_prefetch(next_keys + sizeof(T) * size_t(d + u) * block_size, _MM_HINT_T0);
      }
      for (int u = 0; u < kScoreChains; ++u) {
        const __m512 key_row = load16(in_span, span.keys[c] + size_t(d + u) * block_size);
        for (int r = 0; r < R; ++r)
          acc[r][u] = _mm512_fmadd_ps(_mm512_set1_ps(rows[r].q[d + u]), key_row, acc[r][u]);
      }
    }
    for (int r = 0; r < R; ++r) {
      __m512 dot = acc[r][0];
      for (int u = 1; u < kScoreChains; ++u) dot = _mm512_add_ps(dot, acc[r][u]);
      const __m512 scores =
          _mm512_mask_blend_ps(live[r][c], _mm512_set1_ps(-std::numeric_limits<float>::infinity()),
                               _mm512_mul_ps(dot, _mm512_set1_ps(scale)));
      span_max[r] = _mm512_max_ps(span_max[r], scores);
      _mm512_store_ps(weights[r] + c * kKeyChunk, scores);
    }
  }

  float correction[R];
  for (int r = 0; r < R; ++r) {
    const float new_max = state.raise_max(r0 + r, _mm512_reduce_max_ps(span_max[r]), correction[r]);
    for (int i = 0; i < span.chunks * kKeyChunk; ++i)
      weights[r][i] = fast_exp(weights[r][i] - new_max);
    // exp(-inf) comes out of fast_exp as ~1e-38, not 0, so the keys a row does not see are
    // zeroed: they add nothing to its sum nor to its values.
    __m512 sum = _mm512_setzero_ps();
    for (int c = 0; c < span.chunks; ++c) {
      const __m512 w = _mm512_maskz_loadu_ps(live[r][c], weights[r] + c * kKeyChunk);
      _mm512_store_ps(weights[r] + c * kKeyChunk, w);
      sum = _mm512_add_ps(sum, w);
    }
    state.sum[r0 + r] = state.sum[r0 + r] * correction[r] + _mm512_reduce_add_ps(sum);
  }

  for (int v0 = 0; v0 < NV; v0 += kSlice) {
    __m512 acc[R][kSlice];
    for (int r = 0; r < R; ++r) {
      const float* acc_r = state.acc + (r0 + r) * kHeadDim + 16 * v0;
      for (int v = 0; v < kSlice; ++v)
        acc[r][v] = _mm512_mul_ps(_mm512_load_ps(acc_r + 16 * v), _mm512_set1_ps(correction[r]));
    }
    for (int c = 0; c < span.chunks; ++c) {
      const float* w[R];
      for (int r = 0; r < R; ++r) w[r] = weights[r] + c * kKeyChunk;
      const T* values = span.values[c] + 16 * v0;
      const char* next_values =
          v0 == 0 ? read_after(span, next, &SpanChunks<T>::values, c) : nullptr;
      for (int j = 0; j < span.count[c]; ++j) {
        if (next_values) {
          for (size_t line = 0; line < sizeof(T) * kHeadDim; line += 64)
            _mm_prefetch(next_values + sizeof(T) * size_t(j) * kHeadDim + line, _MM_HINT_T0);
        }
        add_value_row<kSlice, R>(values + j * kHeadDim, w, j, acc);
      }
    }
    for (int r = 0; r < R; ++r) {
      float* acc_r = state.acc + (r0 + r) * kHeadDim + 16 * v0;
      for (int v = 0; v < kSlice; ++v) _mm512_store_ps(acc_r + 16 * v, acc[r][v]);
    }
  }
}

// The kernel for head_dim = 16·NV over elements T (attend_by_spans' Kernel).
template <int NV, class T>
struct Avx512Spans {
  using Element = T;
  static constexpr int kHeadDim = 16 * NV;
  // Rows the AVX-512 kernel scores and weighs together: each key row and value row it loads (and
  // widens, from bf16) serves all of them.
  static constexpr int kRowsTogether = 4;
  template <int R>
  PIPELINE_AVX512 static void span(const SpanChunks<T>& span, const SpanChunks<T>& next,
                                   int block_size, float scale, const AttentionRow* rows,
                                   SoftmaxState& state, int r0) {
    attend_span<NV, R>(span, next, block_size, scale, rows, state, r0);
  }
};

}  // namespace

AttendFn avx512_attention_kernel(const PagedKvLayer& kv) {
  if (kv.block_size % kKeyChunk != 0) return nullptr;
  return with_element_type(kv, "paged_attention", [&](auto element) -> AttendFn {
    using T = decltype(element);
    if (kv.head_dim == 64) return attend_by_spans<Avx512Spans<4, T>>;
    if (kv.head_dim == 128) return attend_by_spans<Avx512Spans<8, T>>;
    return nullptr;
  });
}

}  // namespace pipeline::cpu::detail
