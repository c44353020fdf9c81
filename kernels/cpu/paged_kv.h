// One layer's view of the paged KV pool and the write of new tokens' keys and values into it.
// Layout per layer: K and V each [num_blocks][block_size][num_kv_heads][head_dim] float32, so a
// token's keys for all heads are contiguous and a block holds block_size consecutive positions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace pipeline::cpu {

struct PagedKvLayer {
  float* k = nullptr;
  float* v = nullptr;
  int block_size = 16;
  int num_kv_heads = 0;
  int head_dim = 0;

  int kv_dim() const { return num_kv_heads * head_dim; }
  // Offset of (block, slot)'s first float in k or v.
  size_t slot_offset(int32_t block, int slot) const {
    return (size_t(block) * block_size + slot) * size_t(kv_dim());
  }
};

// Stores rows i = 0..count-1 of k_rows and v_rows ([count, row_stride], the keys or values in
// each row's first kv_dim floats) as the keys and values of positions start_pos + i, in the
// slots `block_table` maps those positions to.
void store_kv(const PagedKvLayer& kv, std::span<const int32_t> block_table, int32_t start_pos,
              int count, const float* k_rows, const float* v_rows, size_t row_stride);

}  // namespace pipeline::cpu
