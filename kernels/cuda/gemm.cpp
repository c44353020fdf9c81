#include "kernels/cuda/gemm.h"

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/skinny_gemm.h"

namespace pipeline::cuda {

namespace {
// cuBLAS allocates its own workspace on first use unless given one, which a graph capture
// does not allow; 32 MiB covers the split-K kernels it picks for these shapes.
constexpr size_t kWorkspaceBytes = size_t(32) << 20;
}  // namespace

Gemm::Gemm(cudaStream_t stream) : stream_(stream), workspace_(kWorkspaceBytes), skinny_(stream) {
  PIPELINE_CUBLAS_CHECK(cublasCreate(&handle_));
  try {
    PIPELINE_CUBLAS_CHECK(cublasSetStream(handle_, stream));
    PIPELINE_CUBLAS_CHECK(cublasSetWorkspace(handle_, workspace_.data(), workspace_.bytes()));
  } catch (...) {
    cublasDestroy(handle_);
    throw;
  }
}

Gemm::~Gemm() {
  cublasDestroy(handle_);
}

void Gemm::linear(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* y, int rows,
                  int in, int out) {
  if (gemv_applies(rows, in)) return gemv(x, w, y, in, out, stream_);
  if (skinny_gemm_applies(rows, in)) return skinny_.run(x, w, y, rows, in, out);
  linear_cublas(x, w, y, rows, in, out);
}

void Gemm::linear_f32(const __nv_bfloat16* x, const __nv_bfloat16* w, float* y, int rows, int in,
                      int out) {
  if (gemv_applies(rows, in)) return gemv(x, w, y, in, out, stream_);
  if (skinny_gemm_applies(rows, in)) return skinny_.run(x, w, y, rows, in, out);
  run(x, w, y, CUDA_R_32F, rows, in, out);
}

void Gemm::linear_silu_mul(const __nv_bfloat16* x, const __nv_bfloat16* w_gate_up,
                           __nv_bfloat16* gate_up, __nv_bfloat16* act, int rows, int in,
                           int inter) {
  if (gemv_applies(rows, in)) return gemv_silu_mul(x, w_gate_up, act, in, inter, stream_);
  if (skinny_gemm_applies(rows, in))
    return skinny_.run_silu_mul(x, w_gate_up, act, rows, in, inter);
  linear_cublas(x, w_gate_up, gate_up, rows, in, 2 * inter);
  silu_mul(gate_up, rows, inter, act, stream_);
}

void Gemm::linear_cublas(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* y, int rows,
                         int in, int out) {
  run(x, w, y, CUDA_R_16BF, rows, in, out);
}

// cuBLAS is column-major: a row-major [rows, n] matrix is a column-major [n, rows] one. So
// y^T [out, rows] = W [in, out]^T . x^T [in, rows], all leading dimensions the row lengths.
void Gemm::run(const __nv_bfloat16* x, const __nv_bfloat16* w, void* y, cudaDataType_t y_type,
               int rows, int in, int out) {
  const float alpha = 1.0f, beta = 0.0f;
  PIPELINE_CUBLAS_CHECK(cublasGemmEx(handle_, CUBLAS_OP_T, CUBLAS_OP_N, out, rows, in, &alpha, w,
                                     CUDA_R_16BF, in, x, CUDA_R_16BF, in, &beta, y, y_type, out,
                                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace pipeline::cuda
