// The SwiGLU gate of LLaMA's MLP: out[i] = silu(gate[i]) · up[i], silu(g) = g / (1 + e^-g), on
// the fused gate/up projection's output, where gate and up values alternate in blocks (see
// PackedMatrix::interleave): unit i's gate is at column (i / block) · 2·block + i % block and
// its up value `block` columns further.
#pragma once

#include <cstddef>

namespace pipeline::cpu {

// gate_up: [rows, ld]; out: [rows, units] contiguous.
void silu_mul_interleaved(const float* gate_up, size_t ld, int rows, int units, int block,
                          float* out);

}  // namespace pipeline::cpu
