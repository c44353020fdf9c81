// y [rows, out] = x [rows, in] . w [out, in]^T through cuBLASLt, by an algorithm the caller
// picks from the ones cuBLASLt's heuristic proposes. cublasGemmEx always runs the heuristic's
// first proposal, and at a decode step's few rows that one streams the 4096-wide projections
// at about half the device's bandwidth; Gemm::tune() times the others on the device instead.
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

namespace pipeline::cuda {

class CublasLtMatmul {
 public:
  // Calls go to `stream` and split k in `workspace`; both outlive this object.
  CublasLtMatmul(cudaStream_t stream, void* workspace, size_t workspace_bytes);
  ~CublasLtMatmul();
  CublasLtMatmul(const CublasLtMatmul&) = delete;
  CublasLtMatmul& operator=(const CublasLtMatmul&) = delete;

  // Up to max_count algorithms for this product, the heuristic's first proposal first. y_type:
  // CUDA_R_16BF or CUDA_R_32F.
  std::vector<cublasLtMatmulAlgo_t> candidates(cudaDataType_t y_type, int rows, int in, int out,
                                               int max_count);
  // Whether `algo` runs this product within the workspace: one proposed for some row count
  // need not run every other.
  bool runs(const cublasLtMatmulAlgo_t& algo, cudaDataType_t y_type, int rows, int in, int out);
  // Whether x, w and y are aligned as the proposals assume (cuBLASLt's default: 256 bytes).
  static bool aligned(const void* x, const void* w, const void* y);
  // Queues the product; false where cuBLASLt turns the call down before queueing anything (an
  // algorithm that runs() does not always run: the operands may not suit it). Other failures
  // throw.
  bool run(const cublasLtMatmulAlgo_t& algo, const __nv_bfloat16* x, const __nv_bfloat16* w,
           void* y, cudaDataType_t y_type, int rows, int in, int out);

 private:
  struct Problem;  // the operation and layout descriptors of one product
  const Problem& problem(cudaDataType_t y_type, int rows, int in, int out);

  cudaStream_t stream_;
  void* workspace_;
  size_t workspace_bytes_;
  cublasLtHandle_t handle_ = nullptr;
  // (y_type, rows, in, out) -> its descriptors, made on first use.
  std::map<std::tuple<cudaDataType_t, int, int, int>, std::unique_ptr<Problem>> problems_;
};

}  // namespace pipeline::cuda
