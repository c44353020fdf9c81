// The AVX-512 matmul: register tiles of 4 weight rows × 4 batch rows (16 accumulators of 16
// floats), weights widened from bf16/f16 in registers, the ragged end of a row by masked loads.
#include <immintrin.h>
// GCC 12's AVX-512 intrinsics self-initialise their "undefined" operands (`__m512 __Y = __Y;`),
// which -Wuninitialized flags once inlined here (GCC bug 105593); the code itself is sound.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/matmul_tiles.h"

#define PIPELINE_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

namespace pipeline::cpu::detail {
namespace {

constexpr int kWidth = 16;

template <DType T>
PIPELINE_AVX512 inline __m512 load_w(const void* row, int i, __mmask16 mask) {
  if constexpr (T == DType::F32) {
    return _mm512_maskz_loadu_ps(mask, static_cast<const float*>(row) + i);
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(mask, static_cast<const uint16_t*>(row) + i);
    if constexpr (T == DType::BF16) {
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    } else {
      return _mm512_cvtph_ps(h);
    }
  }
}

// acc[r][b] += W[row0 + r, k..k+16) · X[b0 + b, k..k+16) over the whole row, then stores.
template <DType T, int NR, int NB>
PIPELINE_AVX512 void tile(const MatmulArgs& a, int row0, int b0) {
  const int cols = a.w.cols;
  const size_t row_bytes = size_t(cols) * dtype_size(T);
  const void* w[NR];
  for (int r = 0; r < NR; ++r)
    w[r] = static_cast<const std::byte*>(a.w.data) + size_t(row0 + r) * row_bytes;
  const float* x[NB];
  for (int b = 0; b < NB; ++b) x[b] = a.x + size_t(b0 + b) * cols;

  __m512 acc[NR][NB];
  for (int r = 0; r < NR; ++r)
    for (int b = 0; b < NB; ++b) acc[r][b] = _mm512_setzero_ps();

  const auto step = [&](int k, __mmask16 mask) PIPELINE_AVX512 {
    __m512 xv[NB];
    for (int b = 0; b < NB; ++b) xv[b] = _mm512_maskz_loadu_ps(mask, x[b] + k);
    for (int r = 0; r < NR; ++r) {
      const __m512 wv = load_w<T>(w[r], k, mask);
      for (int b = 0; b < NB; ++b) acc[r][b] = _mm512_fmadd_ps(wv, xv[b], acc[r][b]);
    }
  };
  int k = 0;
  for (; k + kWidth <= cols; k += kWidth) step(k, __mmask16(0xffff));
  if (k < cols) step(k, __mmask16((1u << (cols - k)) - 1));

  for (int b = 0; b < NB; ++b) {
    float* y = a.y + size_t(b0 + b) * a.w.rows + row0;
    for (int r = 0; r < NR; ++r) {
      const float d = _mm512_reduce_add_ps(acc[r][b]);
      y[r] = a.accumulate ? y[r] + d : d;
    }
  }
}

// One weight tile against the whole batch: the tile stays in L1 while the batch streams past it.
template <DType T, int NR>
PIPELINE_AVX512 void tile_over_batch(const MatmulArgs& a, int row0) {
  int b = 0;
  for (; b + 4 <= a.batch; b += 4) tile<T, NR, 4>(a, row0, b);
  for (; b < a.batch; ++b) tile<T, NR, 1>(a, row0, b);
}

template <DType T>
PIPELINE_AVX512 void rows(const MatmulArgs& a, int row_begin, int row_end) {
  int r = row_begin;
  for (; r + 4 <= row_end; r += 4) tile_over_batch<T, 4>(a, r);
  for (; r < row_end; ++r) tile_over_batch<T, 1>(a, r);
}

}  // namespace

void matmul_rows_avx512(const MatmulArgs& args, int row_begin, int row_end) {
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
