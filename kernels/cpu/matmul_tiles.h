// Internal to the matmul: one function per instruction set that computes output rows
// [row_begin, row_end) of Y = X·Wᵀ for the whole batch. matmul.cpp splits rows across threads
// and calls the one the CPU supports.
#pragma once

#include "kernels/cpu/matmul.h"

namespace pipeline::cpu::detail {

struct MatmulArgs {
  const float* x;
  int batch;
  WeightMatrix w;
  float* y;
  bool accumulate;
};

void matmul_rows_portable(const MatmulArgs& args, int row_begin, int row_end);
void matmul_rows_avx2(const MatmulArgs& args, int row_begin, int row_end);
void matmul_rows_avx512(const MatmulArgs& args, int row_begin, int row_end);

}  // namespace pipeline::cpu::detail
