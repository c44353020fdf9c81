// The matrix-vector product of a one-sequence decode step: y [out] = w [out, in] . x [in] with
// bf16 operands and float32 accumulation. Gemm uses it in place of cuBLAS where it applies.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace pipeline::cuda {

// True when gemv() handles this product: one row, `in` a multiple of 8. (At 4 rows and more,
// reloading x for every row makes it slower than cuBLAS.)
bool gemv_applies(int rows, int in);

void gemv(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* y, int in, int out,
          cudaStream_t stream);
void gemv(const __nv_bfloat16* x, const __nv_bfloat16* w, float* y, int in, int out,
          cudaStream_t stream);
// act [inter] = silu(gate) * up, where w_gate_up [2 * inter, in] holds gate row j at 2j and up
// row j at 2j + 1.
void gemv_silu_mul(const __nv_bfloat16* x, const __nv_bfloat16* w_gate_up, __nv_bfloat16* act,
                   int in, int inter, cudaStream_t stream);

}  // namespace pipeline::cuda
