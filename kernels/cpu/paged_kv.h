// One layer's view of the paged KV pool and the write of new tokens' keys and values into it.
// Layout per layer: K and V each [num_blocks][num_kv_heads][...], one KV head's share of a block
// contiguous (block_size positions), so attention streams each head's keys and values in long
// runs. Within a (block, head): K is [head_dim][block_size] (transposed: the keys of a block's
// positions for one dimension are adjacent, so one vector FMA scores 16 positions), V is
// [block_size][head_dim].
//
// Elements are float32, or bf16 (their uint16_t bit patterns, rounded to nearest even as the
// packed weights are): bf16 halves the pool's memory and the bytes attention reads per token.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>

#include "io/dtype.h"

namespace pipeline::cpu {

struct PagedKvLayer {
  void* k = nullptr;
  void* v = nullptr;
  int block_size = 16;
  int num_kv_heads = 0;
  int head_dim = 0;
  DType dtype = DType::F32;  // F32 (float) or BF16 (uint16_t)

  int kv_dim() const { return num_kv_heads * head_dim; }
  // Offset in elements of (block, kv_head)'s first element in k or v: key slot j, dimension d
  // is at + d · block_size + j in k; value slot j, dimension d at + j · head_dim + d in v.
  size_t head_block_offset(int32_t block, int kv_head) const {
    return (size_t(block) * num_kv_heads + size_t(kv_head)) * size_t(block_size) * head_dim;
  }
};

// Returns body(T{}) for the pool's element type T, float or uint16_t (bf16 bits); throws
// std::invalid_argument, naming `caller`, for a pool of any other type.
template <class Body>
decltype(auto) with_element_type(const PagedKvLayer& kv, const char* caller, Body&& body) {
  switch (kv.dtype) {
    case DType::F32:
      return body(float{});
    case DType::BF16:
      return body(uint16_t{});
    case DType::F16:
      break;
  }
  throw std::invalid_argument(std::string(caller) + ": a KV pool of " + dtype_name(kv.dtype) +
                              " elements is not supported (F32 or BF16)");
}

// Stores rows i = 0..count-1 of k_rows and v_rows ([count, row_stride], the keys or values in
// each row's first kv_dim floats) as the keys and values of positions start_pos + i, in the
// slots `block_table` maps those positions to, converted to the pool's element type.
void store_kv(const PagedKvLayer& kv, std::span<const int32_t> block_table, int32_t start_pos,
              int count, const float* k_rows, const float* v_rows, size_t row_stride);

}  // namespace pipeline::cpu
