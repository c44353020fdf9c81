// Rotary position embeddings in Hugging Face's rotate-half convention: within each head, element
// i pairs with element i + head_dim/2 and the pair turns by the angle pos · theta^(-2i/head_dim).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace pipeline::cpu {

// cos and sin of every (position, frequency) the model can meet, computed once in double.
class RopeTable {
 public:
  RopeTable(int head_dim, int max_positions, double theta);

  int head_dim() const { return head_dim_; }
  const float* cos_at(int pos) const { return cos_.data() + size_t(pos) * (head_dim_ / 2); }
  const float* sin_at(int pos) const { return sin_.data() + size_t(pos) * (head_dim_ / 2); }

 private:
  int head_dim_;
  std::vector<float> cos_;  // [max_positions, head_dim / 2]
  std::vector<float> sin_;
};

// Rotates every head of every row in place. x: [positions.size(), row_stride]; the heads are
// the first num_heads · head_dim floats of each row. Positions must be below max_positions.
void apply_rope(const RopeTable& table, std::span<const int32_t> positions, int num_heads, float* x,
                size_t row_stride);

}  // namespace pipeline::cpu
