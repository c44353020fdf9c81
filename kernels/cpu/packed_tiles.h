// Internal to the packed matmul: one function per instruction set that computes the output
// columns of panels [panel_begin, panel_end) of Y = X·Wᵀ for the whole batch. packed_matmul.cpp
// splits the panels across threads and calls the one the CPU supports.
#pragma once

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

// x [batch, cols] rounded to bf16 (to nearest even) as one-term pairs (PackedArgs::x_pairs),
// out [batch][ceil(cols / 2)]; AVX512_BF16 CPUs only.
void round_to_bf16_pairs_avx512bf16(const float* x, int batch, int cols, uint32_t* out);

void packed_panels_portable(const PackedArgs& args, int panel_begin, int panel_end);
void packed_panels_avx2(const PackedArgs& args, int panel_begin, int panel_end);
void packed_panels_avx512(const PackedArgs& args, int panel_begin, int panel_end);
void packed_panels_avx512bf16(const PackedArgs& args, int panel_begin, int panel_end);

}  // namespace pipeline::cpu::detail
