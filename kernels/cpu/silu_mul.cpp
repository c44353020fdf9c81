#include "kernels/cpu/silu_mul.h"

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include <algorithm>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/fast_exp.h"

namespace pipeline::cpu {
namespace {

// One row. Always inlined into the per-ISA wrappers below, so the loop is vectorised for each.
[[gnu::always_inline]] inline void silu_row(const float* gate_up, int units, int block,
                                            float* out) {
  for (int first = 0; first < units; first += block) {
    const float* gate = gate_up + size_t(first) * 2;
    const float* up = gate + block;
    const int n = std::min(block, units - first);
    for (int i = 0; i < n; ++i) out[first + i] = gate[i] / (1.0f + fast_exp(-gate[i])) * up[i];
  }
}

// Chosen at run time by best_isa() rather than with GCC's target_clones, whose ifunc resolvers
// run before ThreadSanitizer's runtime is up and crash a -fsanitize=thread build at load.
__attribute__((target("avx512f"))) void silu_row_avx512(const float* gate_up, int units, int block,
                                                        float* out) {
  silu_row(gate_up, units, block, out);
}
__attribute__((target("avx2"))) void silu_row_avx2(const float* gate_up, int units, int block,
                                                   float* out) {
  silu_row(gate_up, units, block, out);
}
void silu_row_portable(const float* gate_up, int units, int block, float* out) {
  silu_row(gate_up, units, block, out);
}

using SiluRowFn = void (*)(const float*, int, int, float*);

SiluRowFn silu_row_function() {
  switch (best_isa()) {
    case Isa::Avx512:
    case Isa::Avx512Bf16:
      return silu_row_avx512;
    case Isa::Avx2:
      return silu_row_avx2;
    case Isa::Portable:
      break;
  }
  return silu_row_portable;
}

}  // namespace

void silu_mul_interleaved(const float* gate_up, size_t ld, int rows, int units, int block,
                          float* out) {
  // exp is cheap: only large prefill batches are worth splitting, a few rows per task.
  const int grain = std::max(1, 16384 / std::max(1, units));
  static const SiluRowFn silu_row_for_cpu = silu_row_function();
  tbb::parallel_for(tbb::blocked_range<int>(0, rows, grain), [&](const tbb::blocked_range<int>& r) {
    for (int row = r.begin(); row < r.end(); ++row) {
      silu_row_for_cpu(gate_up + size_t(row) * ld, units, block, out + size_t(row) * units);
    }
  });
}

}  // namespace pipeline::cpu
