#include "kernels/cpu/paged_kv.h"

namespace pipeline::cpu {
namespace {

inline void store_element(float* at, float x) {
  *at = x;
}
inline void store_element(uint16_t* at, float x) {
  *at = f32_to_bf16(x);
}

template <class T>
void store_kv_as(const PagedKvLayer& kv, std::span<const int32_t> block_table, int32_t start_pos,
                 int count, const float* k_rows, const float* v_rows, size_t row_stride) {
  T* const k_pool = static_cast<T*>(kv.k);
  T* const v_pool = static_cast<T*>(kv.v);
  const int head_dim = kv.head_dim;
  for (int i = 0; i < count; ++i) {
    const int32_t pos = start_pos + i;
    const int32_t block = block_table[pos / kv.block_size];
    const int slot = pos % kv.block_size;
    for (int h = 0; h < kv.num_kv_heads; ++h) {
      const size_t at = kv.head_block_offset(block, h);
      const size_t row = size_t(i) * row_stride + size_t(h) * head_dim;
      for (int d = 0; d < head_dim; ++d) {
        store_element(k_pool + at + size_t(d) * kv.block_size + slot, k_rows[row + d]);
        store_element(v_pool + at + size_t(slot) * head_dim + d, v_rows[row + d]);
      }
    }
  }
}

}  // namespace

void store_kv(const PagedKvLayer& kv, std::span<const int32_t> block_table, int32_t start_pos,
              int count, const float* k_rows, const float* v_rows, size_t row_stride) {
  with_element_type(kv, "store_kv", [&](auto element) {
    store_kv_as<decltype(element)>(kv, block_table, start_pos, count, k_rows, v_rows, row_stride);
  });
}

}  // namespace pipeline::cpu
