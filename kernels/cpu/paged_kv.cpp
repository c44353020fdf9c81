#include "kernels/cpu/paged_kv.h"

#include <algorithm>

namespace pipeline::cpu {

void store_kv(const PagedKvLayer& kv, std::span<const int32_t> block_table, int32_t start_pos,
              int count, const float* k_rows, const float* v_rows, size_t row_stride) {
  const size_t dim = size_t(kv.kv_dim());
  for (int i = 0; i < count; ++i) {
    const int32_t pos = start_pos + i;
    const size_t at = kv.slot_offset(block_table[pos / kv.block_size], pos % kv.block_size);
    std::copy_n(k_rows + size_t(i) * row_stride, dim, kv.k + at);
    std::copy_n(v_rows + size_t(i) * row_stride, dim, kv.v + at);
  }
}

}  // namespace pipeline::cpu
