// What the two AVX-512 packed matmuls (packed_matmul_avx512.cpp: widening to float32 FMAs;
// packed_matmul_avx512bf16.cpp: vdpbf16ps) share: the register-tile shapes, the store of a
// tile's accumulators into Y, and the walk over panels and batch rows (the prefetch of the panel
// streams, which the AVX2 kernel shares too, is in packed_tiles.h). A kernel is a type with
//   template <int NP, int NB> static void run(const PackedArgs& a, int panel0, int row0);
// computing panels [panel0, panel0 + NP) for batch rows [row0, row0 + NB).
//   decode (batch <= 4): 4 panels × up to 4 rows, so four panels' weights stream at once and
//                        every row's accumulator chains stay short of the instruction latency;
//   larger batches:      2 panels × 12 rows, 24 accumulators, which amortises each weight
//                        vector over 12 rows (arithmetic-bound prefill).
// Include after the GCC 12 -Wuninitialized pragmas of the kernel files.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/cpu/packed_tiles.h"

#define PIPELINE_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

namespace pipeline::cpu::detail::avx512 {

constexpr int kDecodeRows = 4;
constexpr int kDecodePanels = 4;
constexpr int kWideRows = 12;
constexpr int kWidePanels = 2;

// Y[row0 + b, columns of panel panel0 + p] (+)= acc[p][b]; the columns past out_cols are masked.
template <int NP, int NB>
PIPELINE_AVX512 inline void store_tile(const PackedArgs& a, int panel0, int row0,
                                       const __m512 (&acc)[NP][NB]) {
  for (int p = 0; p < NP; ++p) {
    const int first = (panel0 + p) * kPanelWidth;
    const int lanes = std::min(kPanelWidth, a.w->out_cols() - first);
    const __mmask16 mask = __mmask16((1u << lanes) - 1);
    for (int b = 0; b < NB; ++b) {
      float* y = a.y + size_t(row0 + b) * a.ldy + first;
      __m512 v = acc[p][b];
      if (a.accumulate) v = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, y), v);
      _mm512_mask_storeu_ps(y, mask, v);
    }
  }
}

// Kernel::run<NP, n> for a run-time n in [1, NB].
template <class Kernel, int NP, int NB>
PIPELINE_AVX512 void tile_of(const PackedArgs& a, int panel0, int row0, int n) {
  if constexpr (NB > 0) {
    if (n == NB) return Kernel::template run<NP, NB>(a, panel0, row0);
    tile_of<Kernel, NP, NB - 1>(a, panel0, row0, n);
  }
}

// Rows [row_begin, row_end) against NP panels, NB rows at a time.
template <class Kernel, int NP, int NB>
PIPELINE_AVX512 void rows(const PackedArgs& a, int panel0, int row_begin, int row_end) {
  int r = row_begin;
  for (; r + NB <= row_end; r += NB) Kernel::template run<NP, NB>(a, panel0, r);
  if (r < row_end) tile_of<Kernel, NP, NB - 1>(a, panel0, r, row_end - r);
}

// Panels [panel_begin, panel_end) for the whole batch.
template <class Kernel>
PIPELINE_AVX512 void panels(const PackedArgs& a, int panel_begin, int panel_end) {
  if (a.batch <= kDecodeRows) {
    int p = panel_begin;
    for (; p + kDecodePanels <= panel_end; p += kDecodePanels)
      tile_of<Kernel, kDecodePanels, kDecodeRows>(a, p, 0, a.batch);
    for (; p < panel_end; ++p) tile_of<Kernel, 1, kDecodeRows>(a, p, 0, a.batch);
    return;
  }
  const int pass = rows_per_pass(a.w->cols(), kWideRows);
  for (int r0 = 0; r0 < a.batch; r0 += pass) {
    const int r1 = std::min(a.batch, r0 + pass);
    int p = panel_begin;
    for (; p + kWidePanels <= panel_end; p += kWidePanels)
      rows<Kernel, kWidePanels, kWideRows>(a, p, r0, r1);
    for (; p < panel_end; ++p) rows<Kernel, 1, kWideRows>(a, p, r0, r1);
  }
}

}  // namespace pipeline::cpu::detail::avx512
