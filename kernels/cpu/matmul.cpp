#include "kernels/cpu/matmul.h"

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/cpu/half.h"
#include "kernels/cpu/matmul_tiles.h"

namespace pipeline::cpu {
namespace {

// Threads split the output rows in tiles of this many rows (the ISA kernels' register tile).
constexpr int kRowTile = 4;
// A task should carry at least this many multiply-adds, or scheduling costs more than it saves.
constexpr int64_t kMinMacsPerTask = 1 << 15;

using RowsFn = void (*)(const detail::MatmulArgs&, int, int);

RowsFn rows_function(Isa isa) {
  switch (isa) {
    case Isa::Portable:
      return detail::matmul_rows_portable;
    case Isa::Avx2:
      return detail::matmul_rows_avx2;
    case Isa::Avx512:
    case Isa::Avx512Bf16:  // no bf16-dot variant of the unpacked kernel
      return detail::matmul_rows_avx512;
  }
  return detail::matmul_rows_portable;
}

}  // namespace

void matmul(const float* x, int batch, const WeightMatrix& w, float* y, MatmulMode mode) {
  matmul(best_isa(), x, batch, w, y, mode);
}

void matmul(Isa isa, const float* x, int batch, const WeightMatrix& w, float* y, MatmulMode mode) {
  if (!isa_supported(isa)) {
    throw std::invalid_argument(std::string("matmul: instruction set ") + isa_name(isa) +
                                " is not supported by this CPU");
  }
  if (batch <= 0 || w.rows <= 0) return;
  const detail::MatmulArgs args{x, batch, w, y, mode == MatmulMode::Accumulate};
  const RowsFn rows_fn = rows_function(isa);
  const int tiles = (w.rows + kRowTile - 1) / kRowTile;
  const int64_t macs_per_tile = int64_t(kRowTile) * w.cols * batch;
  const int grain =
      int(std::max<int64_t>(1, kMinMacsPerTask / std::max<int64_t>(1, macs_per_tile)));
  tbb::parallel_for(tbb::blocked_range<int>(0, tiles, grain),
                    [&](const tbb::blocked_range<int>& r) {
                      rows_fn(args, r.begin() * kRowTile, std::min(w.rows, r.end() * kRowTile));
                    });
}

namespace detail {
namespace {

// Eight independent partial sums, so the compiler can vectorise the loop without reassociating.
template <DType T>
float dot_portable(const void* w_row, const float* x, int n) {
  constexpr int kLanes = 8;
  float lanes[kLanes] = {};
  int i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) lanes[l] += load_f32<T>(w_row, i + l) * x[i + l];
  }
  float sum = 0.0f;
  for (; i < n; ++i) sum += load_f32<T>(w_row, i) * x[i];
  for (int l = 0; l < kLanes; ++l) sum += lanes[l];
  return sum;
}

template <DType T>
void rows_portable(const MatmulArgs& a, int row_begin, int row_end) {
  const size_t row_bytes = size_t(a.w.cols) * dtype_size(T);
  for (int r = row_begin; r < row_end; ++r) {
    const void* w_row = static_cast<const std::byte*>(a.w.data) + size_t(r) * row_bytes;
    for (int b = 0; b < a.batch; ++b) {
      const float d = dot_portable<T>(w_row, a.x + size_t(b) * a.w.cols, a.w.cols);
      float& out = a.y[size_t(b) * a.w.rows + r];
      out = a.accumulate ? out + d : d;
    }
  }
}

}  // namespace

void matmul_rows_portable(const MatmulArgs& args, int row_begin, int row_end) {
  switch (args.w.dtype) {
    case DType::F32:
      return rows_portable<DType::F32>(args, row_begin, row_end);
    case DType::BF16:
      return rows_portable<DType::BF16>(args, row_begin, row_end);
    case DType::F16:
      return rows_portable<DType::F16>(args, row_begin, row_end);
  }
}

}  // namespace detail
}  // namespace pipeline::cpu
