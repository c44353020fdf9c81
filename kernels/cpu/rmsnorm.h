// RMSNorm as LLaMA uses it: y = x · rsqrt(mean(x²) + eps) · w, all in float32.
#pragma once

namespace pipeline::cpu {

// x, y: [rows, dim] contiguous (y may alias x); weight: [dim].
void rmsnorm(const float* x, const float* weight, int rows, int dim, float eps, float* y);

}  // namespace pipeline::cpu
