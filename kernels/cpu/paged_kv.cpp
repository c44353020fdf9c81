#include "kernels/cpu/paged_kv.h"

#include <algorithm>

namespace pipeline::cpu {

void store_kv(const PagedKvLayer& kv, std::span<const int32_t> block_table, int32_t start_pos,
              int count, const float* k_rows, const float* v_rows, size_t row_stride) {
  const int head_dim = kv.head_dim;
  for (int i = 0; i < count; ++i) {
    const int32_t pos = start_pos + i;
    const int32_t block = block_table[pos / kv.block_size];
    const int slot = pos % kv.block_size;
    for (int h = 0; h < kv.num_kv_heads; ++h) {
      const size_t at = kv.head_block_offset(block, h);
      const float* key = k_rows + size_t(i) * row_stride + size_t(h) * head_dim;
      for (int d = 0; d < head_dim; ++d) kv.k[at + size_t(d) * kv.block_size + slot] = key[d];
      std::copy_n(v_rows + size_t(i) * row_stride + size_t(h) * head_dim, head_dim,
                  kv.v + at + size_t(slot) * head_dim);
    }
  }
}

}  // namespace pipeline::cpu
