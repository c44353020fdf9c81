// Internal to the packed matmul: one function per instruction set that computes the output
// columns of panels [panel_begin, panel_end) of Y = X·Wᵀ for the whole batch. packed_matmul.cpp
// splits the panels across threads and calls the one the CPU supports. Also what the vector
// kernels share: the prefetch of the panel streams.
#pragma once

#include <xmmintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/packed_matmul.h"

namespace pipeline::cpu::detail {

struct PackedArgs {
  const float* x;  // [batch, w.cols()]
  int batch;
  const PackedMatrix* w;
  float* y;  // [batch, ldy]
  size_t ldy;
  bool accumulate;
  // Avx512Bf16 on bf16 weights only: x as bf16 pairs, [batch][ceil(cols / 2)][terms], the pair
  // of k = 2j, 2j+1 laid out like the weights' lanes (k = 2j in the high half). One term holds
  // bf16(x) (the matrix takes bf16 activations); two hold bf16(x) and bf16(x - bf16(x)), which
  // together carry 16 bits of x (float32 activations).
  const uint32_t* x_pairs;
  int x_terms;
};

// Batch rows one pass over a panel range runs against; the rest wait for the next pass, so the
// activations a pass reads stay in the core's L2 cache (~1 MiB of them) while the weights stream.
inline int rows_per_pass(int cols, int multiple) {
  const int fit = int((size_t(1) << 20) / (size_t(cols) * sizeof(float)));
  return fit < multiple ? multiple : fit / multiple * multiple;
}

// Bytes of one pair block (k = 2j and 2j + 1 of the panel's 16 columns).
template <DType T>
constexpr size_t kBlockBytes = T == DType::F32 ? 128 : 64;

// How far ahead of its loads each panel stream is prefetched. The out-of-order window alone
// spans too few bytes to keep enough cache misses in flight, and the hardware prefetcher restarts
// at every 4 KiB page. Widening bf16 costs two uops per 64 bytes: without this, batch 1 read bf16
// weights at 0.75 of the probed bandwidth (now 0.95), and batch 16 gained about 15% too; the
// AVX2 kernel's batch 1 read 0.58-0.79 of it without, 0.79-0.95 with. The vdpbf16ps kernel needs no
// widening and streams batch 1 as fast without it, but its tiles of 16 rows, 16 instructions per 64
// bytes, ran 1.2-1.3x faster with it. 1 KiB ahead measured best (512 B to 4 KiB tried); prefetchnta
// and prefetcht1 were slower.
constexpr size_t kPrefetchDistance = 1024;

// Prefetches the lines kPrefetchDistance ahead of block j of each of the tile's NP panels. Past a
// panel's end its stream goes on in panel + NP, among the panels this thread streams next, so
// those do not start cold. The last tile's stream runs past the matrix: addresses are computed
// as integers, and a prefetch of memory that is not there is dropped, never a fault. Forced
// inline: GCC otherwise drops the call as having no effect. Plain x86-64 (prefetch is SSE), so
// every vector kernel inlines it.
template <DType T, int NP>
__attribute__((always_inline)) inline void prefetch_ahead(const std::byte* const* panel, int j,
                                                          size_t panel_bytes) {
  size_t offset = size_t(j) * kBlockBytes<T> + kPrefetchDistance;
  if (offset >= panel_bytes) offset += (NP - 1) * panel_bytes;
  for (int p = 0; p < NP; ++p) {
    for (size_t line = 0; line < kBlockBytes<T>; line += 64)
      _mm_prefetch(reinterpret_cast<const char*>(uintptr_t(panel[p]) + offset + line), _MM_HINT_T0);
  }
}

// x [batch, cols] rounded to bf16 (to nearest even) as one-term pairs (PackedArgs::x_pairs),
// out [batch][ceil(cols / 2)]; AVX512_BF16 CPUs only.
void round_to_bf16_pairs_avx512bf16(const float* x, int batch, int cols, uint32_t* out);

void packed_panels_portable(const PackedArgs& args, int panel_begin, int panel_end);
void packed_panels_avx2(const PackedArgs& args, int panel_begin, int panel_end);
void packed_panels_avx512(const PackedArgs& args, int panel_begin, int panel_end);
void packed_panels_avx512bf16(const PackedArgs& args, int panel_begin, int panel_end);

}  // namespace pipeline::cpu::detail
