// A logits row's greedy draw, found where the logits are. Plain C++17 (no <span>), so that the
// CUDA kernels (kernels/cuda/argmax.cu), compiled as C++17, write it directly.
#pragma once

#include <cstdint>

namespace pipeline {

// The lowest token id holding the row's largest value (NaNs never count), and that value. A
// value that is not finite means the row has no finite maximum, so no token to draw.
struct RowArgmax {
  int32_t token = 0;
  float value = 0.0f;
};

}  // namespace pipeline
