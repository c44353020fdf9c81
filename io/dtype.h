// Element types of checkpoint tensors and the scalar conversions between them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace pipeline {

enum class DType : uint8_t { F32, F16, BF16 };

inline size_t dtype_size(DType t) {
  return t == DType::F32 ? 4 : 2;
}

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "F32";
    case DType::F16:
      return "F16";
    case DType::BF16:
      return "BF16";
  }
  return "?";
}

// Accepts safetensors' names ("F32", "F16", "BF16") and the config spellings ("f32", "bf16", ...).
std::optional<DType> parse_dtype(std::string_view name);

inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even, as PyTorch does; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return uint16_t(bits >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// Reads element i of a tensor of type t as float.
inline float load_as_f32(const void* data, DType t, size_t i) {
  switch (t) {
    case DType::F32:
      return static_cast<const float*>(data)[i];
    case DType::BF16:
      return bf16_to_f32(static_cast<const uint16_t*>(data)[i]);
    case DType::F16:
      return f16_to_f32(static_cast<const uint16_t*>(data)[i]);
  }
  return 0.0f;
}

}  // namespace pipeline
