// The AVX-512 packed matmul. Register tile: NP panels (16 output columns each, one zmm) by NB
// batch rows, NP·NB accumulators (shapes and the walk over panels in packed_tiles_avx512.h). Per
// pair of k it loads one 64-byte block per panel, widens it into the even-k and odd-k weight
// vectors (bf16: one AND and one shift), broadcasts the two activations of each row and issues
// 2·NP·NB FMAs. Every tile prefetches its panel streams ahead of its loads (prefetch_ahead).
#include <immintrin.h>
// GCC 12's AVX-512 intrinsics self-initialise their "undefined" operands (`__m512 __Y = __Y;`),
// which -Wuninitialized flags once inlined here (GCC bug 105593); the code itself is sound.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/packed_tiles_avx512.h"

namespace pipeline::cpu::detail {
namespace {

using avx512::store_tile;

// The weights of k = 2j and k = 2j + 1 for the panel's 16 columns.
template <DType T>
PIPELINE_AVX512 inline void load_pair(const std::byte* panel, int j, __m512& even, __m512& odd) {
  if constexpr (T == DType::BF16) {
    const __m512i v = _mm512_load_si512(panel + size_t(j) * 64);
    even = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(int(0xffff0000u))));
    odd = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
  } else if constexpr (T == DType::F16) {
    const std::byte* p = panel + size_t(j) * 64;
    even = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(p)));
    odd = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(p + 32)));
  } else {
    const float* p = reinterpret_cast<const float*>(panel + size_t(j) * 128);
    even = _mm512_load_ps(p);
    odd = _mm512_load_ps(p + 16);
  }
}

// The widening kernel for weights of type T (see packed_tiles_avx512.h).
template <DType T>
struct Widening {
  template <int NP, int NB>
  PIPELINE_AVX512 static void run(const PackedArgs& a, int panel0, int row0);
};

template <DType T>
template <int NP, int NB>
PIPELINE_AVX512 void Widening<T>::run(const PackedArgs& a, int panel0, int row0) {
  const PackedMatrix& w = *a.w;
  const int cols = w.cols();
  const std::byte* panel[NP];
  for (int p = 0; p < NP; ++p) panel[p] = w.panel(panel0 + p);
  const float* x[NB];
  for (int b = 0; b < NB; ++b) x[b] = a.x + size_t(row0 + b) * cols;

  __m512 acc[NP][NB];
  for (int p = 0; p < NP; ++p)
    for (int b = 0; b < NB; ++b) acc[p][b] = _mm512_setzero_ps();

  const int pairs = cols / 2;
  for (int j = 0; j < pairs; ++j) {
    prefetch_ahead<T, NP>(panel, j, w.panel_bytes());
    __m512 even[NP], odd[NP];
    for (int p = 0; p < NP; ++p) load_pair<T>(panel[p], j, even[p], odd[p]);
    for (int b = 0; b < NB; ++b) {
      const __m512 xe = _mm512_set1_ps(x[b][2 * j]);
      const __m512 xo = _mm512_set1_ps(x[b][2 * j + 1]);
      for (int p = 0; p < NP; ++p) {
        acc[p][b] = _mm512_fmadd_ps(even[p], xe, acc[p][b]);
        acc[p][b] = _mm512_fmadd_ps(odd[p], xo, acc[p][b]);
      }
    }
  }
  if (cols % 2 != 0) {  // the last k has no partner: its odd half is padding
    __m512 even[NP], odd[NP];
    for (int p = 0; p < NP; ++p) load_pair<T>(panel[p], pairs, even[p], odd[p]);
    for (int b = 0; b < NB; ++b) {
      const __m512 xe = _mm512_set1_ps(x[b][cols - 1]);
      for (int p = 0; p < NP; ++p) acc[p][b] = _mm512_fmadd_ps(even[p], xe, acc[p][b]);
    }
  }

  store_tile(a, panel0, row0, acc);
}

}  // namespace

void packed_panels_avx512(const PackedArgs& args, int panel_begin, int panel_end) {
  switch (args.w->dtype()) {
    case DType::F32:
      return avx512::panels<Widening<DType::F32>>(args, panel_begin, panel_end);
    case DType::BF16:
      return avx512::panels<Widening<DType::BF16>>(args, panel_begin, panel_end);
    case DType::F16:
      return avx512::panels<Widening<DType::F16>>(args, panel_begin, panel_end);
  }
}

}  // namespace pipeline::cpu::detail
