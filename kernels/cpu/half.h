// Scalar widening of 16-bit floats for the kernels' portable paths.
#pragma once

#include <cstdint>
#include <cstring>

#include "io/dtype.h"

namespace pipeline::cpu {

// IEEE half to float through GCC's _Float16, which needs no F16C instructions.
inline float f16_bits_to_f32(uint16_t bits) {
  _Float16 h;
  std::memcpy(&h, &bits, sizeof h);
  return float(h);
}

// Element i of a row of type T, as float.
template <DType T>
inline float load_f32(const void* row, size_t i) {
  if constexpr (T == DType::F32) {
    return static_cast<const float*>(row)[i];
  } else if constexpr (T == DType::BF16) {
    return bf16_to_f32(static_cast<const uint16_t*>(row)[i]);
  } else {
    return f16_bits_to_f32(static_cast<const uint16_t*>(row)[i]);
  }
}

}  // namespace pipeline::cpu
