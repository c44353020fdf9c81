// Batched matrix times transposed weight: Y[b, out] = X[b, in] · W[out, in]ᵀ, the shape of every
// LLaMA projection in Hugging Face layout. W stays in its checkpoint dtype (f32, bf16, f16) and is
// widened to float32 in registers; accumulation is float32.
//
// Loop structure: threads split the output rows; each thread takes a tile of weight rows and runs
// the whole batch against it before moving on, so every weight byte is read from memory once per
// call, however many tokens the batch holds. Decode is bound by that weight stream.
#pragma once

#include <cstddef>

#include "io/dtype.h"
#include "kernels/cpu/cpu_features.h"

namespace pipeline::cpu {

// A row-major [rows, cols] matrix in its file dtype, read in place.
struct WeightMatrix {
  const void* data = nullptr;
  DType dtype = DType::F32;
  int rows = 0;  // out_features
  int cols = 0;  // in_features
};

enum class MatmulMode {
  Overwrite,   // Y = X·Wᵀ
  Accumulate,  // Y += X·Wᵀ (fuses a residual add)
};

// x: [batch, w.cols] contiguous; y: [batch, w.rows] contiguous. Runs in the calling task arena.
void matmul(const float* x, int batch, const WeightMatrix& w, float* y,
            MatmulMode mode = MatmulMode::Overwrite);
// The same on a chosen instruction set (which must be supported), for tests and benchmarks.
void matmul(Isa isa, const float* x, int batch, const WeightMatrix& w, float* y,
            MatmulMode mode = MatmulMode::Overwrite);

}  // namespace pipeline::cpu
