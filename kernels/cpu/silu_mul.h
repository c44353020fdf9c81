// The SwiGLU gate of LLaMA's MLP: gate[i] = silu(gate[i]) · up[i], silu(g) = g / (1 + e^-g).
#pragma once

#include <cstddef>

namespace pipeline::cpu {

// gate, up: n floats each; the result overwrites gate.
void silu_mul(float* gate, const float* up, size_t n);

}  // namespace pipeline::cpu
