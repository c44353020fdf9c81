// A weight tensor as the kernels read it: a row-major [rows, cols] matrix in its checkpoint
// dtype (f32, bf16, f16), read in place from the loaded file. The projections repack theirs
// (kernels/cpu/packed_matmul.h); the embedding table is read as it is.
#pragma once

#include "io/dtype.h"

namespace pipeline::cpu {

struct WeightMatrix {
  const void* data = nullptr;
  DType dtype = DType::F32;
  int rows = 0;  // out_features
  int cols = 0;  // in_features
};

}  // namespace pipeline::cpu
