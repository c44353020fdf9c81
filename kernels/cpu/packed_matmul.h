// The projections' matmul on weights repacked once at load: Y[b, c] = X[b, :] · W[c, :], with W
// stored as panels of kPanelWidth output columns so that one vector load brings the weights of
// 16 outputs and the kernel broadcasts activations against them (no horizontal sums, and each
// weight vector is widened once for up to 12 batch rows held in registers).
//
// Panel layout: panel p holds output columns [16p, 16p + 16); inside it, k runs in pairs, and
// the pair (2j, 2j+1) is one block of 32 values:
//   bf16: 16 32-bit lanes, lane i = W[16p+i, 2j] << 16 | W[16p+i, 2j+1], so the even k is the
//         lane with its low half masked off and the odd k the lane shifted left by 16: two
//         single-uop widenings per 32 weights.
//   f16, f32: 16 values for k = 2j, then 16 for k = 2j+1.
// Missing columns and the odd k past the end are zeros. The panels live in memory advised for
// transparent huge pages (kernels/cpu/huge_page_buffer.h).
//
// Kernels: AVX-512 and AVX2 widen the weights in registers and use float32 FMAs; on CPUs with
// AVX512_BF16, bf16 weights go through vdpbf16ps instead (packed_matmul_avx512bf16.cpp), which
// needs no widening; a portable loop runs anywhere else.
//
// Every output column is accumulated in float32 by fused multiply-adds in k order, whatever the
// batch size or register tile, so a sequence's results never depend on what it is batched with.
//
// Activations: float32 and float16 matrices take them in float32. A bf16 matrix takes them as
// packed for it: rounded to bf16 (as the CUDA kernels take them, and where vdpbf16ps runs at its
// full rate) or in float32 (vdpbf16ps then multiplies two bf16 terms of each, half the rate).
//
// Several matrices that read the same input pack into one (the fused q/k/v and gate/up
// projections) and come out of one pass over the weights.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "io/dtype.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/huge_page_buffer.h"
#include "kernels/cpu/weight_matrix.h"

namespace pipeline::cpu {

constexpr int kPanelWidth = 16;

enum class MatmulMode {
  Overwrite,   // Y = X·Wᵀ
  Accumulate,  // Y += X·Wᵀ (fuses a residual add)
};

// Rounds n up to whole panels.
constexpr int panel_round_up(int n) {
  return (n + kPanelWidth - 1) / kPanelWidth * kPanelWidth;
}

class PackedMatrix {
 public:
  PackedMatrix() = default;

  // Stacks `parts` (same cols and dtype) along the output axis, each starting on a panel
  // boundary: part i's row r is output column part_offset(i) + r. `activations` (F32 or BF16):
  // what a bf16 matrix rounds its activations to (see above); other dtypes ignore it.
  static PackedMatrix stack(std::span<const WeightMatrix> parts, DType activations = DType::F32);
  // Interleaves two equally shaped matrices panel by panel: a's row r is output column
  // (r / 16) · 32 + r % 16, b's the same plus 16. Used for gate/up, so that one 32-column stretch
  // of the output holds the gate and up values of the same 16 MLP units.
  static PackedMatrix interleave(const WeightMatrix& a, const WeightMatrix& b,
                                 DType activations = DType::F32);

  DType dtype() const { return dtype_; }
  // BF16 when the activations are rounded to bf16 before they are multiplied, else F32.
  DType activations() const { return activations_; }
  int cols() const { return cols_; }          // in_features: K
  int out_cols() const { return out_cols_; }  // output columns written per row of Y
  int num_panels() const { return num_panels_; }
  int part_offset(int part) const { return part_offsets_[size_t(part)]; }
  // Bytes of one panel: ceil(K / 2) blocks of 32 values.
  size_t panel_bytes() const { return panel_bytes_; }
  const std::byte* panel(int p) const { return data_.get() + size_t(p) * panel_bytes_; }
  size_t bytes() const { return size_t(num_panels_) * panel_bytes_; }
  // Output column c's weights W[c, 0..cols) as float32, into out (cols() floats): a row of the
  // embedding table where a tied lm_head is the only copy kept.
  void unpack_column(int c, float* out) const;

 private:
  // source[c]: the row of output column c, or nullptr for a zero column.
  static PackedMatrix pack(DType dtype, int cols, int out_cols,
                           std::span<const std::byte* const> source, DType activations);

  DType dtype_ = DType::F32;
  DType activations_ = DType::F32;
  int cols_ = 0;
  int out_cols_ = 0;
  int num_panels_ = 0;
  size_t panel_bytes_ = 0;
  std::unique_ptr<int[]> part_offsets_;
  HugePageBuffer data_;
};

// y[b · ldy + c] (=|+=) Σ_k x[b · w.cols() + k] · W[c, k] for c < w.out_cols(). Runs in the
// calling task arena; threads take disjoint panel ranges, each streaming its weights once per
// call however large the batch.
void matmul(const float* x, int batch, const PackedMatrix& w, float* y, size_t ldy,
            MatmulMode mode = MatmulMode::Overwrite);
// The same on a chosen instruction set (which must be supported), for tests and benchmarks.
void matmul(Isa isa, const float* x, int batch, const PackedMatrix& w, float* y, size_t ldy,
            MatmulMode mode = MatmulMode::Overwrite);
// The instruction set matmul() without one runs w on: vdpbf16ps (Avx512Bf16) serves bf16 weights
// only, and only where it was timed faster than widening them to float32 for FMAs
// (bf16_matmul_isa).
Isa matmul_isa(const PackedMatrix& w);
// What bf16 weights taking `activations` run on: on an AVX512_BF16 CPU, the faster of vdpbf16ps
// and the AVX-512 widening kernel, timed once per process (a few tens of milliseconds, at the
// first call) on a compute-bound product of 32 rows by a 1024 x 1024 matrix on one thread;
// vdpbf16ps keeps it unless the other is more than 10% faster. CPUs differ: vdpbf16ps was the
// one measured fast on an AMD EPYC (Zen 4), while on an Intel Xeon (Sapphire Rapids) the
// widening kernel took 0.6–0.75 of its time with bf16 activations and 0.3 with float32 ones.
// Elsewhere best_matmul_isa().
Isa bf16_matmul_isa(DType activations);

}  // namespace pipeline::cpu
