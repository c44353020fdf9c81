// The projections of the forward pass: y = x . W^T with x [rows, in] and W in Hugging Face's
// [out, in] layout, bf16 operands, float32 accumulation. A single row goes to gemv(), 2 to 64
// rows to SkinnyGemm, the rest through cuBLAS: one handle per stream, with its own workspace so
// the calls can be captured into CUDA graphs.
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/skinny_gemm.h"

namespace pipeline::cuda {

class Gemm {
 public:
  explicit Gemm(cudaStream_t stream);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // y [rows, out] bf16 = x [rows, in] . w [out, in]^T
  void linear(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* y, int rows, int in,
              int out);
  // The same with a float32 result (the logits).
  void linear_f32(const __nv_bfloat16* x, const __nv_bfloat16* w, float* y, int rows, int in,
                  int out);
  // act [rows, inter] = silu(gate) * up of x . w_gate_up^T, whose 2 * inter columns are gate and
  // up interleaved (gate row j of the weights at 2j, up row j at 2j + 1). Up to kSkinnyMaxRows rows
  // the projection's epilogue applies it; cuBLAS rows land in gate_up [rows, 2 * inter] first.
  void linear_silu_mul(const __nv_bfloat16* x, const __nv_bfloat16* w_gate_up,
                       __nv_bfloat16* gate_up, __nv_bfloat16* act, int rows, int in, int inter);
  // y = x . w^T by cuBLAS at any row count: what linear() does past kSkinnyMaxRows rows, and
  // what the benchmarks hold the GEMV and SkinnyGemm paths against.
  void linear_cublas(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* y, int rows,
                     int in, int out);

 private:
  void run(const __nv_bfloat16* x, const __nv_bfloat16* w, void* y, cudaDataType_t y_type, int rows,
           int in, int out);

  cudaStream_t stream_;
  cublasHandle_t handle_ = nullptr;
  DeviceBuffer<std::byte> workspace_;
  SkinnyGemm skinny_;
};

}  // namespace pipeline::cuda
