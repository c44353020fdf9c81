// The AVX512_BF16 packed matmul for bf16 weights: vdpbf16ps multiplies a weight block (16 lanes,
// each the bf16 pair of k = 2j, 2j+1, exactly as packed) by a broadcast pair of activations and
// adds both products to the float32 accumulator, so no widening instructions are needed. The
// activations are not rounded to bf16 once (that would cost 8 bits of their precision) but split
// into bf16(x) and bf16(x - bf16(x)), and each weight block is multiplied by both: the products
// are exact, so the result keeps 16 bits of each activation and matches the float32 kernels to
// within their tolerance. Register tiles as in packed_matmul_avx512.cpp.
#include <immintrin.h>
// GCC 12's AVX-512 intrinsics self-initialise their "undefined" operands (`__m512 __Y = __Y;`),
// which -Wuninitialized flags once inlined here (GCC bug 105593); the code itself is sound.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/cpu/packed_tiles.h"

#define PIPELINE_AVX512_BF16 \
  __attribute__((target("avx512bf16,avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

namespace pipeline::cpu::detail {
namespace {

constexpr int kDecodeRows = 4;
constexpr int kDecodePanels = 4;
constexpr int kWideRows = 12;
constexpr int kWidePanels = 2;

template <int NP, int NB>
PIPELINE_AVX512_BF16 void tile(const PackedArgs& a, int panel0, int row0) {
  const PackedMatrix& w = *a.w;
  const int pairs = (w.cols() + 1) / 2;  // an odd last k is zero-padded in weights and x alike
  const std::byte* panel[NP];
  for (int p = 0; p < NP; ++p) panel[p] = w.panel(panel0 + p);
  const uint32_t* x[NB];
  for (int b = 0; b < NB; ++b) x[b] = a.x_pairs + size_t(row0 + b) * pairs * 2;

  __m512 acc[NP][NB];
  for (int p = 0; p < NP; ++p)
    for (int b = 0; b < NB; ++b) acc[p][b] = _mm512_setzero_ps();

  for (int j = 0; j < pairs; ++j) {
    __m512bh wv[NP];
    for (int p = 0; p < NP; ++p) wv[p] = (__m512bh)_mm512_load_si512(panel[p] + size_t(j) * 64);
    for (int b = 0; b < NB; ++b) {
      const __m512bh hi = (__m512bh)_mm512_set1_epi32(int(x[b][2 * j]));
      const __m512bh lo = (__m512bh)_mm512_set1_epi32(int(x[b][2 * j + 1]));
      for (int p = 0; p < NP; ++p) {
        acc[p][b] = _mm512_dpbf16_ps(acc[p][b], wv[p], hi);
        acc[p][b] = _mm512_dpbf16_ps(acc[p][b], wv[p], lo);
      }
    }
  }

  for (int p = 0; p < NP; ++p) {
    const int first = (panel0 + p) * kPanelWidth;
    const int lanes = std::min(kPanelWidth, w.out_cols() - first);
    const __mmask16 mask = __mmask16((1u << lanes) - 1);
    for (int b = 0; b < NB; ++b) {
      float* y = a.y + size_t(row0 + b) * a.ldy + first;
      __m512 v = acc[p][b];
      if (a.accumulate) v = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, y), v);
      _mm512_mask_storeu_ps(y, mask, v);
    }
  }
}

// tile<NP, n> for a run-time n in [1, NB].
template <int NP, int NB>
PIPELINE_AVX512_BF16 void tile_of(const PackedArgs& a, int panel0, int row0, int n) {
  if constexpr (NB > 0) {
    if (n == NB) return tile<NP, NB>(a, panel0, row0);
    tile_of<NP, NB - 1>(a, panel0, row0, n);
  }
}

template <int NP, int NB>
PIPELINE_AVX512_BF16 void rows(const PackedArgs& a, int panel0, int row_begin, int row_end) {
  int r = row_begin;
  for (; r + NB <= row_end; r += NB) tile<NP, NB>(a, panel0, r);
  if (r < row_end) tile_of<NP, NB - 1>(a, panel0, r, row_end - r);
}

}  // namespace

void packed_panels_avx512bf16(const PackedArgs& a, int panel_begin, int panel_end) {
  if (a.batch <= kDecodeRows) {
    int p = panel_begin;
    for (; p + kDecodePanels <= panel_end; p += kDecodePanels)
      tile_of<kDecodePanels, kDecodeRows>(a, p, 0, a.batch);
    for (; p < panel_end; ++p) tile_of<1, kDecodeRows>(a, p, 0, a.batch);
    return;
  }
  const int pass = rows_per_pass(a.w->cols(), kWideRows);
  for (int r0 = 0; r0 < a.batch; r0 += pass) {
    const int r1 = std::min(a.batch, r0 + pass);
    int p = panel_begin;
    for (; p + kWidePanels <= panel_end; p += kWidePanels)
      rows<kWidePanels, kWideRows>(a, p, r0, r1);
    for (; p < panel_end; ++p) rows<1, kWideRows>(a, p, r0, r1);
  }
}

}  // namespace pipeline::cpu::detail
