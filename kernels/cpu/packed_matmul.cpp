#include "kernels/cpu/packed_matmul.h"

#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/half.h"
#include "kernels/cpu/packed_tiles.h"

namespace pipeline::cpu {
namespace {

// Panels one chunk takes at least: the AVX-512 kernel's widest group.
constexpr int kPanelsPerUnit = 4;
// Weight bytes a chunk should stream at least, or taking it costs more than it saves.
constexpr size_t kMinBytesPerChunk = size_t(32) << 10;
// A thread's next chunk is this fraction of the units left divided by the thread count
// (guided self-scheduling): the first chunks are long streams, the last ones short, so the
// threads finish within one short chunk of each other. With TBB's fixed grain (8 equal tasks
// on 2 threads) a thread waited up to an eighth of the matrix for the other at the end of
// every matmul, and decode ends about sixty of them per token.
constexpr int kChunkDivisor = 2;

void check_parts(std::span<const WeightMatrix> parts) {
  if (parts.empty()) throw std::invalid_argument("PackedMatrix: no matrices to pack");
  for (const WeightMatrix& p : parts) {
    if (p.data == nullptr || p.rows <= 0 || p.cols <= 0) {
      throw std::invalid_argument("PackedMatrix: empty matrix (" + std::to_string(p.rows) + " x " +
                                  std::to_string(p.cols) + ")");
    }
    if (p.cols != parts[0].cols || p.dtype != parts[0].dtype) {
      throw std::invalid_argument(
          "PackedMatrix: matrices packed together must share in_features and dtype, got " +
          std::to_string(p.cols) + " " + dtype_name(p.dtype) + " and " +
          std::to_string(parts[0].cols) + " " + dtype_name(parts[0].dtype));
    }
  }
}

const std::byte* row_of(const WeightMatrix& m, int r) {
  return static_cast<const std::byte*>(m.data) + size_t(r) * size_t(m.cols) * dtype_size(m.dtype);
}

// Writes one panel from its 16 source rows (nullptr: zeros); see the layout in the header.
void pack_panel(DType dtype, int cols, const std::byte* const* rows, std::byte* out) {
  const int pairs = (cols + 1) / 2;
  const size_t esize = dtype_size(dtype);
  std::memset(out, 0, size_t(pairs) * 2 * kPanelWidth * esize);
  for (int lane = 0; lane < kPanelWidth; ++lane) {
    const std::byte* row = rows[lane];
    if (row == nullptr) continue;
    if (dtype == DType::BF16) {
      uint16_t values[2];
      for (int j = 0; j < pairs; ++j) {
        const int n = std::min(2, cols - 2 * j);
        values[1] = 0;
        std::memcpy(values, row + size_t(2 * j) * 2, size_t(n) * 2);
        const uint32_t lane_bits = uint32_t(values[0]) << 16 | values[1];
        std::memcpy(out + (size_t(j) * kPanelWidth + lane) * 4, &lane_bits, 4);
      }
    } else {
      for (int k = 0; k < cols; ++k) {
        const size_t slot = size_t(k / 2) * 2 * kPanelWidth + size_t(k % 2) * kPanelWidth + lane;
        std::memcpy(out + slot * esize, row + size_t(k) * esize, esize);
      }
    }
  }
}

// Weight (lane, k) of a panel, as float.
template <DType T>
float panel_value(const std::byte* panel, int lane, int k) {
  if constexpr (T == DType::BF16) {
    uint32_t bits;
    std::memcpy(&bits, panel + (size_t(k / 2) * kPanelWidth + lane) * 4, 4);
    return std::bit_cast<float>(k % 2 == 0 ? bits & 0xffff0000u : bits << 16);
  } else {
    const size_t slot = size_t(k / 2) * 2 * kPanelWidth + size_t(k % 2) * kPanelWidth + lane;
    return load_f32<T>(panel, slot);
  }
}

template <DType T>
void unpack_lane(const std::byte* panel, int lane, int cols, float* out) {
  for (int k = 0; k < cols; ++k) out[k] = panel_value<T>(panel, lane, k);
}

}  // namespace

PackedMatrix PackedMatrix::pack(DType dtype, int cols, int out_cols,
                                std::span<const std::byte* const> source, DType activations) {
  if (activations != DType::F32 && activations != DType::BF16) {
    throw std::invalid_argument(std::string("PackedMatrix: activations in ") +
                                dtype_name(activations) + " are not supported (F32 or BF16)");
  }
  PackedMatrix m;
  m.dtype_ = dtype;
  m.activations_ = dtype == DType::BF16 ? activations : DType::F32;
  m.cols_ = cols;
  m.out_cols_ = out_cols;
  m.num_panels_ = int(source.size()) / kPanelWidth;
  m.panel_bytes_ = size_t((cols + 1) / 2) * 2 * kPanelWidth * dtype_size(dtype);
  m.data_ = allocate_huge_page_buffer(m.bytes());
  tbb::parallel_for(0, m.num_panels_, [&](int p) {
    pack_panel(dtype, cols, source.data() + size_t(p) * kPanelWidth,
               m.data_.get() + size_t(p) * m.panel_bytes_);
  });
  return m;
}

void PackedMatrix::unpack_column(int c, float* out) const {
  const std::byte* p = panel(c / kPanelWidth);
  const int lane = c % kPanelWidth;
  switch (dtype_) {
    case DType::F32:
      return unpack_lane<DType::F32>(p, lane, cols_, out);
    case DType::BF16:
      return unpack_lane<DType::BF16>(p, lane, cols_, out);
    case DType::F16:
      return unpack_lane<DType::F16>(p, lane, cols_, out);
  }
}

PackedMatrix PackedMatrix::stack(std::span<const WeightMatrix> parts, DType activations) {
  check_parts(parts);
  std::vector<int> offsets;
  std::vector<const std::byte*> source;
  for (const WeightMatrix& part : parts) {
    offsets.push_back(int(source.size()));
    for (int r = 0; r < part.rows; ++r) source.push_back(row_of(part, r));
    source.resize(size_t(panel_round_up(int(source.size()))), nullptr);
  }
  PackedMatrix m =
      pack(parts[0].dtype, parts[0].cols, offsets.back() + parts.back().rows, source, activations);
  m.part_offsets_ = std::make_unique<int[]>(offsets.size());
  std::copy(offsets.begin(), offsets.end(), m.part_offsets_.get());
  return m;
}

PackedMatrix PackedMatrix::interleave(const WeightMatrix& a, const WeightMatrix& b,
                                      DType activations) {
  const WeightMatrix parts[] = {a, b};
  check_parts(parts);
  if (a.rows != b.rows) {
    throw std::invalid_argument("PackedMatrix::interleave: matrices have " +
                                std::to_string(a.rows) + " and " + std::to_string(b.rows) +
                                " rows");
  }
  const int width = panel_round_up(a.rows);
  std::vector<const std::byte*> source(size_t(2 * width), nullptr);
  for (int r = 0; r < a.rows; ++r) {
    const size_t column = size_t(r / kPanelWidth) * 2 * kPanelWidth + size_t(r % kPanelWidth);
    source[column] = row_of(a, r);
    source[column + kPanelWidth] = row_of(b, r);
  }
  PackedMatrix m = pack(a.dtype, a.cols, 2 * width, source, activations);
  m.part_offsets_ = std::make_unique<int[]>(2);
  m.part_offsets_[0] = 0;
  m.part_offsets_[1] = kPanelWidth;
  return m;
}

namespace {

// x as two-term bf16 pairs (PackedArgs::x_pairs): bf16(x) and bf16(x - bf16(x)), out
// [batch][ceil(cols / 2)][2].
void split_into_bf16_pairs(const float* x, int batch, int cols, uint32_t* out) {
  const int per_row = (cols + 1) / 2;
  for (int b = 0; b < batch; ++b) {
    const float* row = x + size_t(b) * cols;
    uint32_t* pairs = out + size_t(b) * per_row * 2;
    for (int j = 0; j < per_row; ++j) {
      uint32_t hi = 0, lo = 0;
      for (int i = 0; i < 2 && 2 * j + i < cols; ++i) {
        const float v = row[2 * j + i];
        const uint16_t h = f32_to_bf16(v);
        const int shift = i == 0 ? 16 : 0;  // k = 2j in the high half
        hi |= uint32_t(h) << shift;
        lo |= uint32_t(f32_to_bf16(v - bf16_to_f32(h))) << shift;
      }
      pairs[2 * j] = hi;
      pairs[2 * j + 1] = lo;
    }
  }
}

// x as the bf16 pairs the Avx512Bf16 kernel multiplies, `terms` a pair, in a buffer of the
// calling thread that only grows, so steady decoding does not allocate.
const uint32_t* bf16_pairs(const float* x, int batch, int cols, int terms) {
  thread_local ScratchArray<uint32_t> pairs;
  pairs.grow(size_t(batch) * size_t((cols + 1) / 2) * terms);
  if (terms == 1) {
    detail::round_to_bf16_pairs_avx512bf16(x, batch, cols, pairs.data());
  } else {
    split_into_bf16_pairs(x, batch, cols, pairs.data());
  }
  return pairs.data();
}

// x rounded to bf16 and widened back, for the kernels that multiply in float32, in a buffer of
// the calling thread like bf16_pairs'.
const float* rounded_to_bf16(const float* x, size_t n) {
  thread_local ScratchArray<float> rounded;
  rounded.grow(n);
  float* out = rounded.data();
  for (size_t i = 0; i < n; ++i) out[i] = bf16_to_f32(f32_to_bf16(x[i]));
  return out;
}

using PanelsFn = void (*)(const detail::PackedArgs&, int, int);

PanelsFn panels_function(Isa isa, bool bf16_dot) {
  switch (isa) {
    case Isa::Portable:
      return detail::packed_panels_portable;
    case Isa::Avx2:
      return detail::packed_panels_avx2;
    case Isa::Avx512:
      return detail::packed_panels_avx512;
    case Isa::Avx512Bf16:
      return bf16_dot ? detail::packed_panels_avx512bf16 : detail::packed_panels_avx512;
  }
  return detail::packed_panels_portable;
}

// Whether vdpbf16ps is no more than 10% slower than widening to float32 for FMAs, for bf16
// weights taking `activations` (bf16_matmul_isa): a 32-row product by a 1024 x 1024 matrix
// (2 MiB, in the caches, so the arithmetic decides), on one thread, best of three rounds that
// alternate the two kernels so that a busy moment of the host falls on both.
bool bf16_dot_pays(DType activations) {
  constexpr int kRows = 1024, kCols = 1024, kBatch = 32, kCalls = 3;
  std::vector<uint16_t> weights(size_t(kRows) * kCols);
  uint32_t state = 1;
  for (uint16_t& w : weights) {
    state = state * 1664525u + 1013904223u;
    w = uint16_t(0x3c00u | (state >> 25));  // bf16 values near 0.01
  }
  const WeightMatrix matrix{weights.data(), DType::BF16, kRows, kCols};
  const PackedMatrix w = PackedMatrix::stack(std::span(&matrix, 1), activations);
  const std::vector<float> x(size_t(kBatch) * kCols, 0.5f);
  std::vector<float> y(size_t(kBatch) * kRows);
  const auto seconds = [&](Isa isa) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kCalls; ++i) matmul(isa, x.data(), kBatch, w, y.data(), kRows);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  double dot = 1e30, widening = 1e30;
  tbb::task_arena(1).execute([&] {
    for (int round = 0; round < 3; ++round) {
      dot = std::min(dot, seconds(Isa::Avx512Bf16));
      widening = std::min(widening, seconds(Isa::Avx512));
    }
  });
  return dot <= 1.1 * widening;
}

}  // namespace

void matmul(const float* x, int batch, const PackedMatrix& w, float* y, size_t ldy,
            MatmulMode mode) {
  matmul(matmul_isa(w), x, batch, w, y, ldy, mode);
}

Isa matmul_isa(const PackedMatrix& w) {
  if (w.dtype() == DType::BF16) return bf16_matmul_isa(w.activations());
  const Isa best = best_matmul_isa();
  return best == Isa::Avx512Bf16 ? Isa::Avx512 : best;
}

Isa bf16_matmul_isa(DType activations) {
  if (best_matmul_isa() != Isa::Avx512Bf16) return best_matmul_isa();
  // Each kind of activations is timed when it is first asked for: a process that runs one kind
  // pays for one timing.
  if (activations == DType::BF16) {
    static const bool dot_pays = bf16_dot_pays(DType::BF16);
    return dot_pays ? Isa::Avx512Bf16 : Isa::Avx512;
  }
  static const bool dot_pays = bf16_dot_pays(DType::F32);
  return dot_pays ? Isa::Avx512Bf16 : Isa::Avx512;
}

void matmul(Isa isa, const float* x, int batch, const PackedMatrix& w, float* y, size_t ldy,
            MatmulMode mode) {
  require_isa(isa, "matmul");
  if (batch <= 0 || w.num_panels() == 0) return;
  if (ldy < size_t(w.out_cols())) {
    throw std::invalid_argument("matmul: ldy " + std::to_string(ldy) + " is below the " +
                                std::to_string(w.out_cols()) + " output columns");
  }
  // vdpbf16ps multiplies bf16 by bf16: only bf16 weights have a use for it.
  const bool bf16_dot = isa == Isa::Avx512Bf16 && w.dtype() == DType::BF16;
  const bool bf16_inputs = w.activations() == DType::BF16;
  const int x_terms = bf16_inputs ? 1 : 2;
  const detail::PackedArgs args{
      bf16_inputs && !bf16_dot ? rounded_to_bf16(x, size_t(batch) * w.cols()) : x,
      batch,
      &w,
      y,
      ldy,
      mode == MatmulMode::Accumulate,
      bf16_dot ? bf16_pairs(x, batch, w.cols(), x_terms) : nullptr,
      x_terms};
  const PanelsFn panels_fn = panels_function(isa, bf16_dot);
  const int panels = w.num_panels();
  const int units = (panels + kPanelsPerUnit - 1) / kPanelsPerUnit;
  const size_t unit_bytes = kPanelsPerUnit * w.panel_bytes();
  const int min_units = int((kMinBytesPerChunk + unit_bytes - 1) / unit_bytes);
  const int threads = tbb::this_task_arena::max_concurrency();
  if (threads == 1 || units <= min_units) {
    panels_fn(args, 0, panels);
    return;
  }
  // Every thread takes chunks until none is left; one that starts late (or that the shared
  // machine slows down) simply takes fewer.
  std::atomic<int> next_unit{0};
  const auto take_chunks = [&](int) {
    int begin = next_unit.load(std::memory_order_relaxed);
    while (begin < units) {
      const int chunk = std::max(min_units, (units - begin) / (kChunkDivisor * threads));
      if (!next_unit.compare_exchange_weak(begin, begin + chunk, std::memory_order_relaxed)) {
        continue;  // another thread took [begin, ...): begin now holds the new next unit
      }
      panels_fn(args, begin * kPanelsPerUnit, std::min(panels, (begin + chunk) * kPanelsPerUnit));
      begin = next_unit.load(std::memory_order_relaxed);
    }
  };
  tbb::parallel_for(0, threads, take_chunks);
}

namespace detail {
namespace {

template <DType T>
void panels_portable(const PackedArgs& a, int panel_begin, int panel_end) {
  const PackedMatrix& w = *a.w;
  const int cols = w.cols();
  for (int p = panel_begin; p < panel_end; ++p) {
    const std::byte* panel = w.panel(p);
    const int first = p * kPanelWidth;
    const int lanes = std::min(kPanelWidth, w.out_cols() - first);
    for (int b = 0; b < a.batch; ++b) {
      const float* x = a.x + size_t(b) * cols;
      float acc[kPanelWidth] = {};
      for (int k = 0; k < cols; ++k) {
        for (int lane = 0; lane < kPanelWidth; ++lane)
          acc[lane] += panel_value<T>(panel, lane, k) * x[k];
      }
      float* y = a.y + size_t(b) * a.ldy + first;
      for (int lane = 0; lane < lanes; ++lane)
        y[lane] = a.accumulate ? y[lane] + acc[lane] : acc[lane];
    }
  }
}

}  // namespace

void packed_panels_portable(const PackedArgs& args, int panel_begin, int panel_end) {
  switch (args.w->dtype()) {
    case DType::F32:
      return panels_portable<DType::F32>(args, panel_begin, panel_end);
    case DType::BF16:
      return panels_portable<DType::BF16>(args, panel_begin, panel_end);
    case DType::F16:
      return panels_portable<DType::F16>(args, panel_begin, panel_end);
  }
}

}  // namespace detail
}  // namespace pipeline::cpu
