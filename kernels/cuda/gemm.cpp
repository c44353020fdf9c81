#include "kernels/cuda/gemm.h"

#include <cstdio>
#include <stdexcept>
#include <string>

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
  project(Product::bf16, !skinny_for(Product::bf16, rows, in, out), x, w, y, nullptr, rows, in,
          out);
}

void Gemm::linear_f32(const __nv_bfloat16* x, const __nv_bfloat16* w, float* y, int rows, int in,
                      int out) {
  if (gemv_applies(rows, in)) return gemv(x, w, y, in, out, stream_);
  project(Product::f32, !skinny_for(Product::f32, rows, in, out), x, w, y, nullptr, rows, in, out);
}

void Gemm::linear_silu_mul(const __nv_bfloat16* x, const __nv_bfloat16* w_gate_up,
                           __nv_bfloat16* gate_up, __nv_bfloat16* act, int rows, int in,
                           int inter) {
  if (gemv_applies(rows, in)) return gemv_silu_mul(x, w_gate_up, act, in, inter, stream_);
  project(Product::silu_mul, !skinny_for(Product::silu_mul, rows, in, 2 * inter), x, w_gate_up, act,
          gate_up, rows, in, 2 * inter);
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

void Gemm::project(Product product, bool cublas, const __nv_bfloat16* x, const __nv_bfloat16* w,
                   void* y, __nv_bfloat16* gate_up, int rows, int in, int out) {
  auto* y16 = static_cast<__nv_bfloat16*>(y);
  switch (product) {
    case Product::bf16:
      return cublas ? run(x, w, y, CUDA_R_16BF, rows, in, out)
                    : skinny_.run(x, w, y16, rows, in, out);
    case Product::f32:
      return cublas ? run(x, w, y, CUDA_R_32F, rows, in, out)
                    : skinny_.run(x, w, static_cast<float*>(y), rows, in, out);
    case Product::silu_mul:
      if (!cublas) return skinny_.run_silu_mul(x, w, y16, rows, in, out / 2);
      run(x, w, gate_up, CUDA_R_16BF, rows, in, out);
      return silu_mul(gate_up, rows, out / 2, y16, stream_);
  }
}

bool Gemm::skinny_for(Product product, int rows, int in, int out) const {
  if (!skinny_gemm_applies(rows, in)) return false;
  const auto tuned = cublas_faster_.find({product, in, out, skinny_build_rows(rows)});
  return tuned == cublas_faster_.end() || !tuned->second;
}

std::string Gemm::tune(Product product, const __nv_bfloat16* x,
                       const std::vector<const __nv_bfloat16*>& weights, void* y,
                       __nv_bfloat16* gate_up, int in, int out, int max_rows) {
  auto matrix = [&](int i) { return weights[size_t(i) % weights.size()]; };
  std::string report;
  for (int rows : kSkinnyBuildRows) {
    if (rows > max_rows || !skinny_gemm_applies(rows, in)) break;
    auto time_path = [&](bool cublas) {
      return time_call(
          [&](int i) { project(product, cublas, x, matrix(i), y, gate_up, rows, in, out); });
    };
    float skinny_ms = 0.0f, cublas_ms = 0.0f;
    try {
      skinny_ms = time_path(false);
      cublas_ms = time_path(true);
    } catch (const std::runtime_error& e) {
      // A timing that cannot run (its graph capture failed, say) leaves this row count untuned,
      // on SkinnyGemm, as a decode step whose capture fails runs eagerly: the runner still
      // serves. A sticky device error fails the next pass instead.
      report += std::string(report.empty() ? "" : "; ") + std::to_string(rows) +
                " rows: not timed (" + e.what() + ") -> SkinnyGemm";
      continue;
    }
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
