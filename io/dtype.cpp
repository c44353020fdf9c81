#include "io/dtype.h"

#include <cctype>
#include <string>

namespace pipeline {

std::optional<DType> parse_dtype(std::string_view name) {
  std::string n(name);
  for (char& c : n) c = char(std::toupper(static_cast<unsigned char>(c)));
  if (n == "F32" || n == "FLOAT32") return DType::F32;
  if (n == "F16" || n == "FLOAT16") return DType::F16;
  if (n == "BF16" || n == "BFLOAT16") return DType::BF16;
  return std::nullopt;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);  // inf or NaN
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {  // subnormal: normalise it
    exponent = 113;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    bits = sign | (exponent << 23) | ((mantissa & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint16_t sign = uint16_t((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // overflows to inf
  if (abs < 0x33000001u) return sign;             // underflows to zero
  int exponent = int(abs >> 23) - 127 + 15;
  uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
  int shift = exponent > 0 ? 13 : 13 + 1 - exponent;
  if (exponent <= 0) exponent = 0;
  uint32_t half = mantissa >> shift;
  const uint32_t rest = mantissa & ((1u << shift) - 1);
  const uint32_t halfway = 1u << (shift - 1);
  if (rest > halfway || (rest == halfway && (half & 1u))) ++half;  // round to nearest even
  // A normal number's `half` still holds the implicit bit (0x400); a rounding carry into 0x800
  // correctly bumps the exponent.
  if (exponent > 0) half = (uint32_t(exponent) << 10) + half - 0x400u;
  return uint16_t(sign | half);
}

}  // namespace pipeline
