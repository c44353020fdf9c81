#include "kernels/cuda/gemm.h"

#include <cstdio>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_objects.h"
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
  if (skinny_for(Product::bf16, rows, in, out)) return skinny_.run(x, w, y, rows, in, out);
  linear_cublas(x, w, y, rows, in, out);
}

void Gemm::linear_f32(const __nv_bfloat16* x, const __nv_bfloat16* w, float* y, int rows, int in,
                      int out) {
  if (gemv_applies(rows, in)) return gemv(x, w, y, in, out, stream_);
  if (skinny_for(Product::f32, rows, in, out)) return skinny_.run(x, w, y, rows, in, out);
  run(x, w, y, CUDA_R_32F, rows, in, out);
}

void Gemm::linear_silu_mul(const __nv_bfloat16* x, const __nv_bfloat16* w_gate_up,
                           __nv_bfloat16* gate_up, __nv_bfloat16* act, int rows, int in,
                           int inter) {
  if (gemv_applies(rows, in)) return gemv_silu_mul(x, w_gate_up, act, in, inter, stream_);
  if (skinny_for(Product::silu_mul, rows, in, 2 * inter))
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

bool Gemm::skinny_for(Product product, int rows, int in, int out) const {
  if (!skinny_gemm_applies(rows, in)) return false;
  const auto tuned = cublas_faster_.find({product, in, out, skinny_build_rows(rows)});
  return tuned == cublas_faster_.end() || !tuned->second;
}

std::string Gemm::tune(Product product, const __nv_bfloat16* x,
                       const std::vector<const __nv_bfloat16*>& weights, void* y,
                       __nv_bfloat16* gate_up, int in, int out, int max_rows) {
  auto* y16 = static_cast<__nv_bfloat16*>(y);
  auto matrix = [&](int i) { return weights[size_t(i) % weights.size()]; };
  std::string report;
  for (int rows : kSkinnyBuildRows) {
    if (rows > max_rows || !skinny_gemm_applies(rows, in)) break;
    const float skinny_ms = time_call([&](int i) {
      switch (product) {
        case Product::bf16:
          return skinny_.run(x, matrix(i), y16, rows, in, out);
        case Product::f32:
          return skinny_.run(x, matrix(i), static_cast<float*>(y), rows, in, out);
        case Product::silu_mul:
          return skinny_.run_silu_mul(x, matrix(i), y16, rows, in, out / 2);
      }
    });
    const float cublas_ms = time_call([&](int i) {
      switch (product) {
        case Product::bf16:
          return run(x, matrix(i), y, CUDA_R_16BF, rows, in, out);
        case Product::f32:
          return run(x, matrix(i), y, CUDA_R_32F, rows, in, out);
        case Product::silu_mul:
          run(x, matrix(i), gate_up, CUDA_R_16BF, rows, in, out);
          return silu_mul(gate_up, rows, out / 2, y16, stream_);
      }
    });
    const bool cublas = cublas_ms < skinny_ms;
    cublas_faster_[{product, in, out, rows}] = cublas;
    char clause[128];
    std::snprintf(clause, sizeof clause, "%s%d rows: SkinnyGemm %.1f us, cuBLAS %.1f us -> %s",
                  report.empty() ? "" : "; ", rows, 1e3f * skinny_ms, 1e3f * cublas_ms,
                  cublas ? "cuBLAS" : "SkinnyGemm");
    report += clause;
  }
  return report;
}

float Gemm::time_call(const std::function<void(int)>& call) {
  // The calls run as a captured graph, as a decode step's do: timing eager launches would time
  // the host's launch rate for the shorter kernels.
  constexpr int kCalls = 8;
  auto make_calls = [&] {
    for (int i = 0; i < kCalls; ++i) call(i);
  };
  make_calls();  // eagerly first: kernels load and cuBLAS picks its algorithm outside a capture
  const auto calls = capture_graph(stream_, make_calls);
  const Event start, stop;
  calls->launch(stream_);  // untimed
  float best = 0.0f;
  for (int run = 0; run < 3; ++run) {
    PIPELINE_CUDA_CHECK(cudaEventRecord(start.get(), stream_));
    calls->launch(stream_);
    PIPELINE_CUDA_CHECK(cudaEventRecord(stop.get(), stream_));
    PIPELINE_CUDA_CHECK(cudaEventSynchronize(stop.get()));
    float ms = 0.0f;
    PIPELINE_CUDA_CHECK(cudaEventElapsedTime(&ms, start.get(), stop.get()));
    if (run == 0 || ms < best) best = ms;
  }
  return best / kCalls;
}

}  // namespace pipeline::cuda
