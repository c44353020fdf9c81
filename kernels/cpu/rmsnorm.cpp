#include "kernels/cpu/rmsnorm.h"

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include <cmath>
#include <cstddef>

namespace pipeline::cpu {
namespace {

// Eight independent partial sums, so the compiler can vectorise without reassociating.
float sum_of_squares(const float* x, int n) {
  constexpr int kLanes = 8;
  float lanes[kLanes] = {};
  int i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) lanes[l] += x[i + l] * x[i + l];
  }
  float sum = 0.0f;
  for (; i < n; ++i) sum += x[i] * x[i];
  for (int l = 0; l < kLanes; ++l) sum += lanes[l];
  return sum;
}

void rmsnorm_row(const float* x, const float* weight, int dim, float eps, float* y) {
  const float inv_rms = 1.0f / std::sqrt(sum_of_squares(x, dim) / float(dim) + eps);
  for (int i = 0; i < dim; ++i) y[i] = x[i] * inv_rms * weight[i];
}

}  // namespace

void rmsnorm(const float* x, const float* weight, int rows, int dim, float eps, float* y) {
  // Rows are cheap (a few thousand floats): give each task several.
  const int grain = dim >= 4096 ? 1 : 4096 / dim;
  tbb::parallel_for(tbb::blocked_range<int>(0, rows, grain), [&](const tbb::blocked_range<int>& r) {
    for (int row = r.begin(); row < r.end(); ++row) {
      rmsnorm_row(x + size_t(row) * dim, weight, dim, eps, y + size_t(row) * dim);
    }
  });
}

}  // namespace pipeline::cpu
