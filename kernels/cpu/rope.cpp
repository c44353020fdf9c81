#include "kernels/cpu/rope.h"

#include <cmath>
#include <stdexcept>
#include <string>

namespace pipeline::cpu {

RopeTable::RopeTable(int head_dim, int max_positions, double theta) : head_dim_(head_dim) {
  if (head_dim <= 0 || head_dim % 2 != 0) {
    throw std::invalid_argument("RopeTable: head_dim must be positive and even, got " +
                                std::to_string(head_dim));
  }
  if (max_positions <= 0 || theta <= 0.0) {
    throw std::invalid_argument("RopeTable: max_positions and theta must be positive");
  }
  const int half = head_dim / 2;
  cos_.resize(size_t(max_positions) * half);
  sin_.resize(size_t(max_positions) * half);
  for (int i = 0; i < half; ++i) {
    const double inv_freq = std::pow(theta, -2.0 * i / head_dim);
    for (int pos = 0; pos < max_positions; ++pos) {
      const double angle = pos * inv_freq;
      cos_[size_t(pos) * half + i] = float(std::cos(angle));
      sin_[size_t(pos) * half + i] = float(std::sin(angle));
    }
  }
}

void apply_rope(const RopeTable& table, std::span<const int32_t> positions, int num_heads, float* x,
                size_t row_stride) {
  const int head_dim = table.head_dim();
  const int half = head_dim / 2;
  for (size_t t = 0; t < positions.size(); ++t) {
    const float* cos = table.cos_at(positions[t]);
    const float* sin = table.sin_at(positions[t]);
    for (int h = 0; h < num_heads; ++h) {
      float* lo = x + t * row_stride + size_t(h) * head_dim;
      float* hi = lo + half;
      for (int i = 0; i < half; ++i) {
        const float a = lo[i];
        const float b = hi[i];
        lo[i] = a * cos[i] - b * sin[i];
        hi[i] = b * cos[i] + a * sin[i];
      }
    }
  }
}

}  // namespace pipeline::cpu
