// The AVX2 matmul: register tiles of 4 weight rows × 2 batch rows (8 accumulators of 8 floats,
// leaving registers for the loads), bf16 widened by shifting, f16 by F16C. AVX2 has no masked
// 16-bit loads, so the ragged end of a row is copied into a zero-padded buffer first.
#include <immintrin.h>
// GCC 12's intrinsics self-initialise their "undefined" operands (`__m256 __Y = __Y;`), which
// -Wuninitialized flags once inlined here (GCC bug 105593); the code itself is sound.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/matmul_tiles.h"

#define PIPELINE_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace pipeline::cpu::detail {
namespace {

constexpr int kWidth = 8;

template <DType T>
PIPELINE_AVX2 inline __m256 load_w(const void* row, int i) {
  if constexpr (T == DType::F32) {
    return _mm256_loadu_ps(static_cast<const float*>(row) + i);
  } else {
    const __m128i h =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(row) + i));
    if constexpr (T == DType::BF16) {
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    } else {
      return _mm256_cvtph_ps(h);
    }
  }
}

PIPELINE_AVX2 inline float horizontal_sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The last (cols % 8) elements of each row, zero-padded to one vector.
template <int NR, int NB>
struct Tail {
  alignas(32) float x[NB][kWidth] = {};
  alignas(32) std::byte w[NR][kWidth * sizeof(float)] = {};
};

template <DType T, int NR, int NB>
PIPELINE_AVX2 void tile(const MatmulArgs& a, int row0, int b0) {
  const int cols = a.w.cols;
  const size_t row_bytes = size_t(cols) * dtype_size(T);
  const void* w[NR];
  for (int r = 0; r < NR; ++r)
    w[r] = static_cast<const std::byte*>(a.w.data) + size_t(row0 + r) * row_bytes;
  const float* x[NB];
  for (int b = 0; b < NB; ++b) x[b] = a.x + size_t(b0 + b) * cols;

  __m256 acc[NR][NB];
  for (int r = 0; r < NR; ++r)
    for (int b = 0; b < NB; ++b) acc[r][b] = _mm256_setzero_ps();

  const auto step = [&](const void* const* w_at, const float* const* x_at, int k) PIPELINE_AVX2 {
    __m256 xv[NB];
    for (int b = 0; b < NB; ++b) xv[b] = _mm256_loadu_ps(x_at[b] + k);
    for (int r = 0; r < NR; ++r) {
      const __m256 wv = load_w<T>(w_at[r], k);
      for (int b = 0; b < NB; ++b) acc[r][b] = _mm256_fmadd_ps(wv, xv[b], acc[r][b]);
    }
  };
  int k = 0;
  for (; k + kWidth <= cols; k += kWidth) step(w, x, k);
  if (k < cols) {
    const int n = cols - k;
    Tail<NR, NB> tail;
    const void* tw[NR];
    const float* tx[NB];
    for (int r = 0; r < NR; ++r) {
      std::memcpy(tail.w[r], static_cast<const std::byte*>(w[r]) + size_t(k) * dtype_size(T),
                  size_t(n) * dtype_size(T));
      tw[r] = tail.w[r];
    }
    for (int b = 0; b < NB; ++b) {
      std::copy(x[b] + k, x[b] + cols, tail.x[b]);
      tx[b] = tail.x[b];
    }
    step(tw, tx, 0);
  }

  for (int b = 0; b < NB; ++b) {
    float* y = a.y + size_t(b0 + b) * a.w.rows + row0;
    for (int r = 0; r < NR; ++r) {
      const float d = horizontal_sum(acc[r][b]);
      y[r] = a.accumulate ? y[r] + d : d;
    }
  }
}

// One weight tile against the whole batch: the tile stays in L1 while the batch streams past it.
template <DType T, int NR>
PIPELINE_AVX2 void tile_over_batch(const MatmulArgs& a, int row0) {
  int b = 0;
  for (; b + 2 <= a.batch; b += 2) tile<T, NR, 2>(a, row0, b);
  for (; b < a.batch; ++b) tile<T, NR, 1>(a, row0, b);
}

template <DType T>
PIPELINE_AVX2 void rows(const MatmulArgs& a, int row_begin, int row_end) {
  int r = row_begin;
  for (; r + 4 <= row_end; r += 4) tile_over_batch<T, 4>(a, r);
  for (; r < row_end; ++r) tile_over_batch<T, 1>(a, r);
}

}  // namespace

void matmul_rows_avx2(const MatmulArgs& args, int row_begin, int row_end) {
  switch (args.w.dtype) {
    case DType::F32:
      return rows<DType::F32>(args, row_begin, row_end);
    case DType::BF16:
      return rows<DType::BF16>(args, row_begin, row_end);
    case DType::F16:
      return rows<DType::F16>(args, row_begin, row_end);
  }
}

}  // namespace pipeline::cpu::detail
