#include "kernels/cuda/cublaslt_matmul.h"

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/cublas_library.h"
#include "kernels/cuda/cuda_check.h"

namespace pipeline::cuda {

namespace {
// What cuBLASLt's heuristic assumes of the pointers unless told less (MIN_ALIGNMENT_*_BYTES).
constexpr uintptr_t kAssumedAlignment = 256;

using Preference = std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>,
                                   decltype(CublasLibrary::LtMatmulPreferenceDestroy)>;
}  // namespace

struct CublasLtMatmul::Problem {
  cublasLtMatmulDesc_t operation = nullptr;
  cublasLtMatrixLayout_t w = nullptr, x = nullptr, y = nullptr;

  Problem() = default;
  Problem(const Problem&) = delete;
  Problem& operator=(const Problem&) = delete;
  ~Problem() {
    if (y) cublas().LtMatrixLayoutDestroy(y);
    if (x) cublas().LtMatrixLayoutDestroy(x);
    if (w) cublas().LtMatrixLayoutDestroy(w);
    if (operation) cublas().LtMatmulDescDestroy(operation);
  }
};

CublasLtMatmul::CublasLtMatmul(cudaStream_t stream, void* workspace, size_t workspace_bytes)
    : stream_(stream), workspace_(workspace), workspace_bytes_(workspace_bytes) {
  PIPELINE_CUBLAS_CHECK(cublas().LtCreate(&handle_));
}

CublasLtMatmul::~CublasLtMatmul() {
  cublas().LtDestroy(handle_);
}

// cuBLAS is column-major, and a row-major [rows, n] matrix is a column-major [n, rows] one: so
// y^T [out, rows] = (w^T)^T . x^T, with w seen as [in, out] and transposed, x as [in, rows].
const CublasLtMatmul::Problem& CublasLtMatmul::problem(cudaDataType_t y_type, int rows, int in,
                                                       int out) {
  std::unique_ptr<Problem>& slot = problems_[{y_type, rows, in, out}];
  if (slot) return *slot;
  auto p = std::make_unique<Problem>();
  PIPELINE_CUBLAS_CHECK(cublas().LtMatmulDescCreate(&p->operation, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t transpose = CUBLAS_OP_T;
  PIPELINE_CUBLAS_CHECK(cublas().LtMatmulDescSetAttribute(p->operation, CUBLASLT_MATMUL_DESC_TRANSA,
                                                          &transpose, sizeof transpose));
  PIPELINE_CUBLAS_CHECK(cublas().LtMatrixLayoutCreate(&p->w, CUDA_R_16BF, in, out, in));
  PIPELINE_CUBLAS_CHECK(cublas().LtMatrixLayoutCreate(&p->x, CUDA_R_16BF, in, rows, in));
  PIPELINE_CUBLAS_CHECK(cublas().LtMatrixLayoutCreate(&p->y, y_type, out, rows, out));
  slot = std::move(p);
  return *slot;
}

std::vector<cublasLtMatmulAlgo_t> CublasLtMatmul::candidates(cudaDataType_t y_type, int rows,
                                                             int in, int out, int max_count) {
  const Problem& p = problem(y_type, rows, in, out);
  cublasLtMatmulPreference_t raw = nullptr;
  PIPELINE_CUBLAS_CHECK(cublas().LtMatmulPreferenceCreate(&raw));
  const Preference preference(raw, cublas().LtMatmulPreferenceDestroy);
  PIPELINE_CUBLAS_CHECK(cublas().LtMatmulPreferenceSetAttribute(
      raw, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes_, sizeof workspace_bytes_));
  // Where k is split, the parts of a bf16 result are summed in float32, as every other path
  // sums its products: the in-place and output-type schemes would round each part to bf16.
  const uint32_t schemes = y_type == CUDA_R_16BF ? CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE
                                                 : CUBLASLT_REDUCTION_SCHEME_MASK;
  PIPELINE_CUBLAS_CHECK(cublas().LtMatmulPreferenceSetAttribute(
      raw, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes, sizeof schemes));
  std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(max_count));
  int count = 0;
  const cublasStatus_t status = cublas().LtMatmulAlgoGetHeuristic(
      handle_, p.operation, p.w, p.x, p.y, p.y, raw, max_count, results.data(), &count);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) return {};  // no algorithm for this product here
  PIPELINE_CUBLAS_CHECK(status);
  std::vector<cublasLtMatmulAlgo_t> algos;
  for (int i = 0; i < count; ++i)
    if (results[size_t(i)].state == CUBLAS_STATUS_SUCCESS) algos.push_back(results[size_t(i)].algo);
  return algos;
}

bool CublasLtMatmul::runs(const cublasLtMatmulAlgo_t& algo, cudaDataType_t y_type, int rows, int in,
                          int out) {
  const Problem& p = problem(y_type, rows, in, out);
  cublasLtMatmulHeuristicResult_t result{};
  return cublas().LtMatmulAlgoCheck(handle_, p.operation, p.w, p.x, p.y, p.y, &algo, &result) ==
             CUBLAS_STATUS_SUCCESS &&
         result.workspaceSize <= workspace_bytes_;
}

bool CublasLtMatmul::aligned(const void* x, const void* w, const void* y) {
  const auto address = [](const void* p) { return reinterpret_cast<uintptr_t>(p); };
  return (address(x) | address(w) | address(y)) % kAssumedAlignment == 0;
}

bool CublasLtMatmul::run(const cublasLtMatmulAlgo_t& algo, const __nv_bfloat16* x,
                         const __nv_bfloat16* w, void* y, cudaDataType_t y_type, int rows, int in,
                         int out) {
  const Problem& p = problem(y_type, rows, in, out);
  const float alpha = 1.0f, beta = 0.0f;
  const cublasStatus_t status =
      cublas().LtMatmul(handle_, p.operation, &alpha, w, p.w, x, p.x, &beta, y, p.y, y, p.y, &algo,
                        workspace_, workspace_bytes_, stream_);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_INVALID_VALUE) return false;
  if (status != CUBLAS_STATUS_SUCCESS)
    throw_cublas_error(status, "cublasLtMatmul", __FILE__, __LINE__);
  return true;
}

}  // namespace pipeline::cuda
