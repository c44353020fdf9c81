#include "kernels/cpu/silu_mul.h"

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include <algorithm>

#include "kernels/cpu/fast_exp.h"

namespace pipeline::cpu {
namespace {

// One row; compiled for AVX-512, AVX2 and baseline, the widest picked at load time.
__attribute__((target_clones("avx512f", "avx2", "default"))) void silu_row(const float* gate_up,
                                                                           int units, int block,
                                                                           float* out) {
  for (int first = 0; first < units; first += block) {
    const float* gate = gate_up + size_t(first) * 2;
    const float* up = gate + block;
    const int n = std::min(block, units - first);
    for (int i = 0; i < n; ++i) out[first + i] = gate[i] / (1.0f + fast_exp(-gate[i])) * up[i];
  }
}

}  // namespace

void silu_mul_interleaved(const float* gate_up, size_t ld, int rows, int units, int block,
                          float* out) {
  // exp is cheap: only large prefill batches are worth splitting, a few rows per task.
  const int grain = std::max(1, 16384 / std::max(1, units));
  tbb::parallel_for(tbb::blocked_range<int>(0, rows, grain), [&](const tbb::blocked_range<int>& r) {
    for (int row = r.begin(); row < r.end(); ++row) {
      silu_row(gate_up + size_t(row) * ld, units, block, out + size_t(row) * units);
    }
  });
}

}  // namespace pipeline::cpu
