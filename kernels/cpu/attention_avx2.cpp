// The AVX2 attention kernel for LLaMA's head sizes (64 and 128) and blocks of a multiple of 16
// positions: the AVX-512 kernel's plan (attention_avx512.cpp) on 8-lane vectors. A chunk of 16
// keys is scored as two vectors, and with 16 registers instead of 32 the kernel takes two rows
// together instead of four. Keys are scored span by span, each span's keys and values asked
// for while the one before it is read.
#include <immintrin.h>
// GCC 12's intrinsics self-initialise their "undefined" operands (`__m256 __Y = __Y;`), which
// -Wuninitialized flags once inlined here (GCC bug 105593); the code itself is sound.
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

#define PIPELINE_AVX2 __attribute__((target("avx2,fma,f16c")))

// Independent FMA chains per half-chunk of a row's scores (by dimension): with the two halves,
// four chains a row, enough to cover the FMA latency when a row is alone (a decode without
// GQA). Fixed, whatever the number of rows, so that a row's sums come in the same order in any
// pass.
constexpr int kScoreChains = 2;

// Eight pool elements from p as floats.
PIPELINE_AVX2 inline __m256 load8(const float* p) {
  return _mm256_loadu_ps(p);
}
PIPELINE_AVX2 inline __m256 load8(const uint16_t* p) {
  const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}

// All bits set in lanes j < n of a vector, clear in the others: with n = a row's keys less the
// first position of a chunk's half, the lanes of that half the row sees.
PIPELINE_AVX2 inline __m256 first_lanes(int n) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n), lane));
}

PIPELINE_AVX2 inline float reduce_max(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

PIPELINE_AVX2 inline float reduce_add(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

// acc[r] += w[r][j] · value row j (8·VS floats at `row`) for each of R rows: the row is loaded
// once for all of them.
template <int VS, int R, class T>
PIPELINE_AVX2 inline void add_value_row(const T* row, const float* const* w, int j,
                                        __m256 (&acc)[R][VS]) {
  __m256 value[VS];
  for (int v = 0; v < VS; ++v) value[v] = load8(row + 8 * v);
  for (int r = 0; r < R; ++r) {
    const __m256 weight = _mm256_set1_ps(w[r][j]);
    for (int v = 0; v < VS; ++v) acc[r][v] = _mm256_fmadd_ps(weight, value[v], acc[r][v]);
  }
}

// Rows r0 .. r0 + R - 1 (head_dim = 8·NV) against one span: scores 16 keys per two vectors, one
// FMA per dimension by the keys' row d (the transposed K layout) and per row, so each key row is
// loaded once for all R rows. A chunk's key rows are read whole (16 positions of one block,
// whatever the chunk holds); lanes past a row's own end score -inf and weigh exactly 0. The
// weighted values are summed a slice of the head at a time, as many vectors as keep R·slice
// accumulators (at most 8) in registers.
template <int NV, int R, class T>
PIPELINE_AVX2 void attend_span(const SpanChunks<T>& span, const SpanChunks<T>& next, int block_size,
                               float scale, const AttentionRow* rows, SoftmaxState& state, int r0) {
  constexpr int kHeadDim = 8 * NV;
  constexpr int kSlice = std::min(NV, int(std::bit_floor(unsigned(8 / R))));
  static_assert(NV % kSlice == 0);
  const __m256 minus_inf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());

  alignas(32) float weights[R][kKeySpan];
  __m256 span_max[R];
  for (int r = 0; r < R; ++r) span_max[r] = minus_inf;
  for (int c = 0; c < span.chunks; ++c) {
    __m256 acc[R][kScoreChains][2];
    for (int r = 0; r < R; ++r)
      for (int u = 0; u < kScoreChains; ++u) acc[r][u][0] = acc[r][u][1] = _mm256_setzero_ps();
    const char* next_keys = read_after(span, next, &SpanChunks<T>::keys, c);
    for (int d = 0; d < kHeadDim; d += kScoreChains) {
      if (next_keys) {
        for (int u = 0; u < kScoreChains; ++u)
          _mm_prefetch(next_keys + sizeof(T) * size_t(d + u) * block_size, _MM_HINT_T0);
      }
      for (int u = 0; u < kScoreChains; ++u) {
        const T* key_row = span.keys[c] + size_t(d + u) * block_size;
        const __m256 low = load8(key_row), high = load8(key_row + 8);
        for (int r = 0; r < R; ++r) {
          const __m256 q = _mm256_set1_ps(rows[r].q[d + u]);
          acc[r][u][0] = _mm256_fmadd_ps(q, low, acc[r][u][0]);
          acc[r][u][1] = _mm256_fmadd_ps(q, high, acc[r][u][1]);
        }
      }
    }
    for (int r = 0; r < R; ++r) {
      for (int h = 0; h < 2; ++h) {
        __m256 dot = acc[r][0][h];
        for (int u = 1; u < kScoreChains; ++u) dot = _mm256_add_ps(dot, acc[r][u][h]);
        const __m256 scores =
            _mm256_blendv_ps(minus_inf, _mm256_mul_ps(dot, _mm256_set1_ps(scale)),
                             first_lanes(rows[r].num_keys - span.first[c] - 8 * h));
        span_max[r] = _mm256_max_ps(span_max[r], scores);
        _mm256_store_ps(weights[r] + c * kKeyChunk + 8 * h, scores);
      }
    }
  }

  float correction[R];
  for (int r = 0; r < R; ++r) {
    const float new_max = state.raise_max(r0 + r, reduce_max(span_max[r]), correction[r]);
    for (int i = 0; i < span.chunks * kKeyChunk; ++i)
      weights[r][i] = fast_exp(weights[r][i] - new_max);
    // exp(-inf) comes out of fast_exp as ~1e-38, not 0, so the keys a row does not see are
    // zeroed: they add nothing to its sum nor to its values.
    __m256 sum = _mm256_setzero_ps();
    for (int c = 0; c < span.chunks; ++c) {
      for (int h = 0; h < 2; ++h) {
        float* at = weights[r] + c * kKeyChunk + 8 * h;
        const __m256 w = _mm256_and_ps(_mm256_load_ps(at),
                                       first_lanes(rows[r].num_keys - span.first[c] - 8 * h));
        _mm256_store_ps(at, w);
        sum = _mm256_add_ps(sum, w);
      }
    }
    state.sum[r0 + r] = state.sum[r0 + r] * correction[r] + reduce_add(sum);
  }

  for (int v0 = 0; v0 < NV; v0 += kSlice) {
    __m256 acc[R][kSlice];
    for (int r = 0; r < R; ++r) {
      const float* acc_r = state.acc + (r0 + r) * kHeadDim + 8 * v0;
      for (int v = 0; v < kSlice; ++v)
        acc[r][v] = _mm256_mul_ps(_mm256_load_ps(acc_r + 8 * v), _mm256_set1_ps(correction[r]));
    }
    for (int c = 0; c < span.chunks; ++c) {
      const float* w[R];
      for (int r = 0; r < R; ++r) w[r] = weights[r] + c * kKeyChunk;
      const T* values = span.values[c] + 8 * v0;
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
      float* acc_r = state.acc + (r0 + r) * kHeadDim + 8 * v0;
      for (int v = 0; v < kSlice; ++v) _mm256_store_ps(acc_r + 8 * v, acc[r][v]);
    }
  }
}

// The kernel for head_dim = 8·NV over elements T (attend_by_spans' Kernel).
template <int NV, class T>
struct Avx2Spans {
  using Element = T;
  static constexpr int kHeadDim = 8 * NV;
  // Rows scored and weighed together: each key row and value row loaded (and widened, from bf16)
  // serves both. Two rows' score accumulators (8), a key row's two halves and a broadcast query
  // element fill 11 of the 16 registers; three rows would leave none spare.
  static constexpr int kRowsTogether = 2;
  template <int R>
  PIPELINE_AVX2 static void span(const SpanChunks<T>& span, const SpanChunks<T>& next,
                                 int block_size, float scale, const AttentionRow* rows,
                                 SoftmaxState& state, int r0) {
    attend_span<NV, R>(span, next, block_size, scale, rows, state, r0);
  }
};

}  // namespace

AttendFn avx2_attention_kernel(const PagedKvLayer& kv) {
  if (kv.block_size % kKeyChunk != 0) return nullptr;
  return with_element_type(kv, "paged_attention", [&](auto element) -> AttendFn {
    using T = decltype(element);
    if (kv.head_dim == 64) return attend_by_spans<Avx2Spans<8, T>>;
    if (kv.head_dim == 128) return attend_by_spans<Avx2Spans<16, T>>;
    return nullptr;
  });
}

}  // namespace pipeline::cpu::detail
