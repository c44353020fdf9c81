#include "kernels/cpu/silu_mul.h"

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include <cmath>

namespace pipeline::cpu {

void silu_mul(float* gate, const float* up, size_t n) {
  constexpr size_t kGrain =
      16384;  // exp() is cheap: only large prefill batches are worth splitting
  tbb::parallel_for(tbb::blocked_range<size_t>(0, n, kGrain),
                    [&](const tbb::blocked_range<size_t>& r) {
                      for (size_t i = r.begin(); i < r.end(); ++i) {
                        const float g = gate[i];
                        gate[i] = g / (1.0f + std::exp(-g)) * up[i];
                      }
                    });
}

}  // namespace pipeline::cpu
