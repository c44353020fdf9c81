// The AVX2 packed matmul: a panel's 16 columns are two ymm halves; register tile one panel by
// up to 4 batch rows (8 accumulators, 4 widened weight vectors, 2 broadcasts: 14 of the 16
// registers). bf16 widens by AND and shift as on AVX-512, f16 by F16C.
#include <immintrin.h>
// GCC 12's intrinsics self-initialise their "undefined" operands (`__m256 __Y = __Y;`), which
// -Wuninitialized flags once inlined here (GCC bug 105593); the code itself is sound.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/cpu/packed_tiles.h"

#define PIPELINE_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace pipeline::cpu::detail {
namespace {

constexpr int kRows = 4;

// Half h (columns 8h..8h+7) of the weights of k = 2j and k = 2j + 1.
template <DType T>
PIPELINE_AVX2 inline void load_pair(const std::byte* panel, int j, int h, __m256& even,
                                    __m256& odd) {
  if constexpr (T == DType::BF16) {
    const __m256i v =
        _mm256_load_si256(reinterpret_cast<const __m256i*>(panel + size_t(j) * 64 + 32 * h));
    even = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(int(0xffff0000u))));
    odd = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  } else if constexpr (T == DType::F16) {
    const std::byte* p = panel + size_t(j) * 64 + 16 * h;
    even = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(p)));
    odd = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(p + 32)));
  } else {
    const float* p = reinterpret_cast<const float*>(panel + size_t(j) * 128) + 8 * h;
    even = _mm256_load_ps(p);
    odd = _mm256_load_ps(p + 16);
  }
}

template <DType T, int NB>
PIPELINE_AVX2 void tile(const PackedArgs& a, int panel_index, int row0) {
  const PackedMatrix& w = *a.w;
  const int cols = w.cols();
  const std::byte* panel = w.panel(panel_index);
  const float* x[NB];
  for (int b = 0; b < NB; ++b) x[b] = a.x + size_t(row0 + b) * cols;

  __m256 acc[2][NB];
  for (int h = 0; h < 2; ++h)
    for (int b = 0; b < NB; ++b) acc[h][b] = _mm256_setzero_ps();

  const int pairs = cols / 2;
  for (int j = 0; j < pairs; ++j) {
    prefetch_ahead<T, 1>(&panel, j, w.panel_bytes());
    __m256 even[2], odd[2];
    for (int h = 0; h < 2; ++h) load_pair<T>(panel, j, h, even[h], odd[h]);
    for (int b = 0; b < NB; ++b) {
      const __m256 xe = _mm256_set1_ps(x[b][2 * j]);
      const __m256 xo = _mm256_set1_ps(x[b][2 * j + 1]);
      for (int h = 0; h < 2; ++h) {
        acc[h][b] = _mm256_fmadd_ps(even[h], xe, acc[h][b]);
        acc[h][b] = _mm256_fmadd_ps(odd[h], xo, acc[h][b]);
      }
    }
  }
  if (cols % 2 != 0) {  // the last k has no partner: its odd half is padding
    __m256 even[2], odd[2];
    for (int h = 0; h < 2; ++h) load_pair<T>(panel, pairs, h, even[h], odd[h]);
    for (int b = 0; b < NB; ++b) {
      const __m256 xe = _mm256_set1_ps(x[b][cols - 1]);
      for (int h = 0; h < 2; ++h) acc[h][b] = _mm256_fmadd_ps(even[h], xe, acc[h][b]);
    }
  }

  const int first = panel_index * kPanelWidth;
  const int lanes = std::min(kPanelWidth, w.out_cols() - first);
  for (int b = 0; b < NB; ++b) {
    alignas(32) float sums[kPanelWidth];
    _mm256_store_ps(sums, acc[0][b]);
    _mm256_store_ps(sums + 8, acc[1][b]);
    float* y = a.y + size_t(row0 + b) * a.ldy + first;
    for (int l = 0; l < lanes; ++l) y[l] = a.accumulate ? y[l] + sums[l] : sums[l];
  }
}

template <DType T, int NB>
PIPELINE_AVX2 void tile_of(const PackedArgs& a, int panel_index, int row0, int n) {
  if constexpr (NB > 0) {
    if (n == NB) return tile<T, NB>(a, panel_index, row0);
    tile_of<T, NB - 1>(a, panel_index, row0, n);
  }
}

template <DType T>
PIPELINE_AVX2 void panels(const PackedArgs& a, int panel_begin, int panel_end) {
  const int pass = rows_per_pass(a.w->cols(), kRows);
  for (int r0 = 0; r0 < a.batch; r0 += pass) {
    const int r1 = std::min(a.batch, r0 + pass);
    for (int p = panel_begin; p < panel_end; ++p) {
      int r = r0;
      for (; r + kRows <= r1; r += kRows) tile<T, kRows>(a, p, r);
      if (r < r1) tile_of<T, kRows - 1>(a, p, r, r1 - r);
    }
  }
}

}  // namespace

void packed_panels_avx2(const PackedArgs& args, int panel_begin, int panel_end) {
  switch (args.w->dtype()) {
    case DType::F32:
      return panels<DType::F32>(args, panel_begin, panel_end);
    case DType::BF16:
      return panels<DType::BF16>(args, panel_begin, panel_end);
    case DType::F16:
      return panels<DType::F16>(args, panel_begin, panel_end);
  }
}

}  // namespace pipeline::cpu::detail
