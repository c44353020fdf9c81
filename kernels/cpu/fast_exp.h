// A float32 exp that compilers vectorise (no libm call): Cody-Waite range reduction to
// r in [-ln2/2, ln2/2], Cephes' degree-6 polynomial, and 2^n put straight into the exponent
// bits. Relative error about 2e-7 (a couple of ulp) over the whole input range; inputs below
// -87.3 return 2^-126 · e^(...) ≈ 0, inputs above 88.3 saturate at about 2^127.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>

namespace pipeline::cpu {

inline float fast_exp(float x) {
  x = std::min(88.3f, std::max(-87.3f, x));
  // Round x·log2(e) to the nearest integer by the float magic-number trick (exact for |n| < 2^22).
  constexpr float kRound = 12582912.0f;  // 1.5 · 2^23
  const float n = (x * 1.44269504088896341f + kRound) - kRound;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float e = p * r * r + r + 1.0f;
  const int32_t bits = (int32_t(n) + 127) << 23;
  return e * std::bit_cast<float>(bits);
}

}  // namespace pipeline::cpu
