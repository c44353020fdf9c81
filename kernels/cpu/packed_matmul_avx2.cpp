// The AVX2 packed matmul: a panel's 16 columns are two ymm halves; register tile one panel by
// up to 6 batch rows (12 accumulators, 2 widened weight vectors, 1 broadcast: 15 of the 16
// registers). bf16 widens by shifts, f16 by F16C.
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

// Six rows, not four: each accumulator takes two dependent FMAs a pair block, and an FMA's
// result is ready 4-5 cycles after it issues, two a cycle; four rows' 8 accumulators spaced a
// chain's FMAs 4 cycles apart, six rows' 12 space them 6. Sixteen rows ran 1.03-1.10x faster.
constexpr int kRows = 6;

// Half h (columns 8h..8h+7) of the weights of k = 2j + odd: the even weights of a pair block
// are widened and used by every row before the odd ones, so only one of the two is live. bf16's
// even half is cleared by two shifts, not an AND: the AND's mask would hold the 16th register,
// and GCC then kept four of the accumulators on the stack.
template <DType T, int odd>
PIPELINE_AVX2 inline __m256 load_half(const std::byte* panel, int j, int h) {
  if constexpr (T == DType::BF16) {
    const __m256i v =
        _mm256_load_si256(reinterpret_cast<const __m256i*>(panel + size_t(j) * 64 + 32 * h));
    return _mm256_castsi256_ps(odd ? _mm256_slli_epi32(v, 16)
                                   : _mm256_slli_epi32(_mm256_srli_epi32(v, 16), 16));
  } else if constexpr (T == DType::F16) {
    const std::byte* p = panel + size_t(j) * 64 + 16 * h + 32 * odd;
    return _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(p)));
  } else {
    return _mm256_load_ps(reinterpret_cast<const float*>(panel + size_t(j) * 128) + 8 * h +
                          16 * odd);
  }
}

// acc[h][b] += half h of weights (j, odd) times x[b][k], for every row b.
template <DType T, int odd, int NB>
PIPELINE_AVX2 inline void multiply_add(const std::byte* panel, int j, const float* const* x, int k,
                                       __m256 (&acc)[2][NB]) {
  const __m256 w0 = load_half<T, odd>(panel, j, 0);
  const __m256 w1 = load_half<T, odd>(panel, j, 1);
  for (int b = 0; b < NB; ++b) {
    const __m256 xb = _mm256_set1_ps(x[b][k]);
    acc[0][b] = _mm256_fmadd_ps(w0, xb, acc[0][b]);
    acc[1][b] = _mm256_fmadd_ps(w1, xb, acc[1][b]);
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
    multiply_add<T, 0>(panel, j, x, 2 * j, acc);
    multiply_add<T, 1>(panel, j, x, 2 * j + 1, acc);
  }
  // The last k of odd in_features has no partner: its odd half is padding.
  if (cols % 2 != 0) multiply_add<T, 0>(panel, pairs, x, cols - 1, acc);

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
      // Tiles as even as the rows allow (16 rows: 6 + 5 + 5, not 6 + 6 + 4): a tile of few
      // rows has few FMA chains and takes nearly as long as a full one.
      int r = r0;
      const int tiles = (r1 - r0 + kRows - 1) / kRows;
      for (int t = 0; t < tiles; ++t) {
        const int n = (r1 - r0) / tiles + (t < (r1 - r0) % tiles ? 1 : 0);
        tile_of<T, kRows>(a, p, r, n);
        r += n;
      }
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
