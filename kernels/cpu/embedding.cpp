#include "kernels/cpu/embedding.h"

#include <cstddef>

#include "kernels/cpu/half.h"

namespace pipeline::cpu {
namespace {

template <DType T>
void gather(const WeightMatrix& table, std::span<const int32_t> tokens, float* out) {
  const size_t cols = size_t(table.cols);
  for (size_t t = 0; t < tokens.size(); ++t) {
    const void* row =
        static_cast<const std::byte*>(table.data) + size_t(tokens[t]) * cols * dtype_size(T);
    for (size_t i = 0; i < cols; ++i) out[t * cols + i] = load_f32<T>(row, i);
  }
}

}  // namespace

void embedding_lookup(const WeightMatrix& table, std::span<const int32_t> tokens, float* out) {
  switch (table.dtype) {
    case DType::F32:
      return gather<DType::F32>(table, tokens, out);
    case DType::BF16:
      return gather<DType::BF16>(table, tokens, out);
    case DType::F16:
      return gather<DType::F16>(table, tokens, out);
  }
}

void embedding_lookup(const PackedMatrix& table, std::span<const int32_t> tokens, float* out) {
  const size_t cols = size_t(table.cols());
  for (size_t t = 0; t < tokens.size(); ++t) table.unpack_column(tokens[t], out + t * cols);
}

}  // namespace pipeline::cpu
