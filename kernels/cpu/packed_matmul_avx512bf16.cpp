// The AVX512_BF16 packed matmul for bf16 weights: vdpbf16ps multiplies a weight block (16 lanes,
// each the bf16 pair of k = 2j, 2j+1, exactly as packed) by a broadcast pair of activations and
// adds both products to the float32 accumulator, so no widening instructions are needed. The
// activations are not rounded to bf16 once (that would cost 8 bits of their precision) but split
// into bf16(x) and bf16(x - bf16(x)), and each weight block is multiplied by both: the products
// are exact, so the result keeps 16 bits of each activation and matches the float32 kernels to
// within their tolerance. Register tiles and the walk over panels: packed_tiles_avx512.h.
#include <immintrin.h>
// GCC 12's AVX-512 intrinsics self-initialise their "undefined" operands (`__m512 __Y = __Y;`),
// which -Wuninitialized flags once inlined here (GCC bug 105593); the code itself is sound.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/packed_tiles_avx512.h"

#define PIPELINE_AVX512_BF16 \
  __attribute__((target("avx512bf16,avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

namespace pipeline::cpu::detail {
namespace {

// The vdpbf16ps kernel for bf16 weights (see packed_tiles_avx512.h).
struct Bf16Dot {
  template <int NP, int NB>
  PIPELINE_AVX512_BF16 static void run(const PackedArgs& a, int panel0, int row0);
};

template <int NP, int NB>
PIPELINE_AVX512_BF16 void Bf16Dot::run(const PackedArgs& a, int panel0, int row0) {
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

  avx512::store_tile(a, panel0, row0, acc);
}

}  // namespace

void packed_panels_avx512bf16(const PackedArgs& a, int panel_begin, int panel_end) {
  avx512::panels<Bf16Dot>(a, panel_begin, panel_end);
}

}  // namespace pipeline::cpu::detail
