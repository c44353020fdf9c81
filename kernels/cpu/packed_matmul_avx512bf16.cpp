// The AVX512_BF16 packed matmul for bf16 weights: vdpbf16ps multiplies a weight block (16 lanes,
// each the bf16 pair of k = 2j, 2j+1, exactly as packed) by a broadcast pair of activations and
// adds both products to the float32 accumulator, so no widening instructions are needed. A
// matrix that takes bf16 activations has them rounded once and does one vdpbf16ps per block. One
// that takes float32 activations has them split into bf16(x) and bf16(x - bf16(x)) and multiplies
// each weight block by both: the products are exact, so the result keeps 16 bits of each
// activation and matches the float32 kernels to within their tolerance, at half the rate.
// Register tiles, the prefetch and the walk over panels: packed_tiles_avx512.h.
#include <immintrin.h>
// GCC 12's AVX-512 intrinsics self-initialise their "undefined" operands (`__m512 __Y = __Y;`),
// which -Wuninitialized flags once inlined here (GCC bug 105593); the code itself is sound.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/cpu/packed_tiles_avx512.h"

#define PIPELINE_AVX512_BF16 \
  __attribute__((target("avx512bf16,avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

namespace pipeline::cpu::detail {
namespace {

// The vdpbf16ps kernel for bf16 weights (see packed_tiles_avx512.h), for activations of `Terms`
// bf16 terms each (PackedArgs::x_terms).
template <int Terms>
struct Bf16Dot {
  template <int NP, int NB>
  PIPELINE_AVX512_BF16 static void run(const PackedArgs& a, int panel0, int row0);
};

template <int Terms>
template <int NP, int NB>
PIPELINE_AVX512_BF16 void Bf16Dot<Terms>::run(const PackedArgs& a, int panel0, int row0) {
  const PackedMatrix& w = *a.w;
  const int pairs = (w.cols() + 1) / 2;  // an odd last k is zero-padded in weights and x alike
  const std::byte* panel[NP];
  for (int p = 0; p < NP; ++p) panel[p] = w.panel(panel0 + p);
  const uint32_t* x[NB];
  for (int b = 0; b < NB; ++b) x[b] = a.x_pairs + size_t(row0 + b) * pairs * Terms;

  __m512 acc[NP][NB];
  for (int p = 0; p < NP; ++p)
    for (int b = 0; b < NB; ++b) acc[p][b] = _mm512_setzero_ps();

  for (int j = 0; j < pairs; ++j) {
    prefetch_ahead<DType::BF16, NP>(panel, j, w.panel_bytes());
    __m512bh wv[NP];
    for (int p = 0; p < NP; ++p) wv[p] = (__m512bh)_mm512_load_si512(panel[p] + size_t(j) * 64);
    for (int b = 0; b < NB; ++b) {
      for (int t = 0; t < Terms; ++t) {
        const __m512bh term = (__m512bh)_mm512_set1_epi32(int(x[b][Terms * j + t]));
        for (int p = 0; p < NP; ++p) acc[p][b] = _mm512_dpbf16_ps(acc[p][b], wv[p], term);
      }
    }
  }

  avx512::store_tile(a, panel0, row0, acc);
}

}  // namespace

PIPELINE_AVX512_BF16 void round_to_bf16_pairs_avx512bf16(const float* x, int batch, int cols,
                                                         uint32_t* out) {
  const int per_row = (cols + 1) / 2;
  for (int b = 0; b < batch; ++b) {
    const float* row = x + size_t(b) * cols;
    uint32_t* pairs = out + size_t(b) * per_row;
    for (int k = 0; k < cols; k += 16) {
      // Past the last column the lanes are 0, which pads an odd last pair with zero.
      const int n = std::min(16, cols - k);
      const __m512 v = _mm512_maskz_loadu_ps(__mmask16((1u << n) - 1), row + k);
      // vcvtneps2bf16 leaves k = 2j in a 32-bit word's low half; the weights hold it in the high.
      const __m256i bits = _mm256_rol_epi32((__m256i)_mm512_cvtneps_pbh(v), 16);
      _mm256_mask_storeu_epi32(pairs + k / 2, __mmask8((1u << ((n + 1) / 2)) - 1), bits);
    }
  }
}

void packed_panels_avx512bf16(const PackedArgs& a, int panel_begin, int panel_end) {
  if (a.x_terms == 1) return avx512::panels<Bf16Dot<1>>(a, panel_begin, panel_end);
  avx512::panels<Bf16Dot<2>>(a, panel_begin, panel_end);
}

}  // namespace pipeline::cpu::detail
