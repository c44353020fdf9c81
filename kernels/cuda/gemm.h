// The projections of the forward pass: y = x . W^T with x [rows, in] and W in Hugging Face's
// [out, in] layout, bf16 operands, float32 accumulation. A single row goes to gemv(), 2 to 64
// rows to SkinnyGemm unless tune() found cuBLAS faster for that shape and number of rows, the
// rest through cuBLAS: one handle per stream, with its own workspace so the calls can be
// captured into CUDA graphs.
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <vector>

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

  // What a call computes: linear(), linear_f32() or linear_silu_mul().
  enum class Product { bf16, f32, silu_mul };

  // Times SkinnyGemm against cuBLAS (with the SiLU*mul kernel after it, for silu_mul) on [out,
  // in] matrices at each SkinnyGemm build's row count up to max_rows, and from then on sends the
  // calls of that product, shape and build to the faster. Successive calls take successive
  // matrices of `weights` (every layer's, say), so that they come from memory, not from L2, as
  // in a forward pass. x holds max_rows rows of `in`; y (act, for silu_mul) and gate_up take
  // the results. Not while the stream is being captured. Returns what it measured.
  std::string tune(Product product, const __nv_bfloat16* x,
                   const std::vector<const __nv_bfloat16*>& weights, void* y,
                   __nv_bfloat16* gate_up, int in, int out, int max_rows);

 private:
  void run(const __nv_bfloat16* x, const __nv_bfloat16* w, void* y, cudaDataType_t y_type, int rows,
           int in, int out);
  // One product by one path: SkinnyGemm, or cuBLAS (for silu_mul, the gate/up columns into
  // gate_up, then the SiLU*mul kernel). y is bf16, float32 for f32, act for silu_mul; out is the
  // weight rows (2 * inter for silu_mul).
  void project(Product product, bool cublas, const __nv_bfloat16* x, const __nv_bfloat16* w,
               void* y, __nv_bfloat16* gate_up, int rows, int in, int out);
  // Whether a call goes to SkinnyGemm: it applies, and tune() did not find cuBLAS faster.
  bool skinny_for(Product product, int rows, int in, int out) const;
  // Milliseconds one call takes: eight calls captured as a graph, the best of three replays
  // after an untimed one; call(i) makes the i-th call.
  float time_call(const std::function<void(int)>& call);

  cudaStream_t stream_;
  cublasHandle_t handle_ = nullptr;
  DeviceBuffer<std::byte> workspace_;
  SkinnyGemm skinny_;
  // (product, in, out, SkinnyGemm build) -> cuBLAS was faster; absent: not tuned, SkinnyGemm.
  std::map<std::tuple<Product, int, int, int>, bool> cublas_faster_;
};

}  // namespace pipeline::cuda
