#include "kernels/cuda/gemm.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "kernels/cuda/cublas_library.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_objects.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/skinny_gemm.h"

namespace pipeline::cuda {

namespace {
// cuBLAS allocates its own workspace on first use unless given one, which a graph capture
// does not allow; 32 MiB covers the split-K kernels it picks for these shapes. It also bounds
// the workspace of the cuBLASLt algorithms tune() is offered.
constexpr size_t kWorkspaceBytes = size_t(32) << 20;

// What a library writes for a product: bf16, float32 for the logits, the bf16 gate/up columns
// for silu_mul (the SiLU*mul kernel then reads them).
cudaDataType_t library_output_type(Gemm::Product product) {
  return product == Gemm::Product::f32 ? CUDA_R_32F : CUDA_R_16BF;
}
}  // namespace

Gemm::Gemm(cudaStream_t stream)
    : stream_(stream),
      workspace_(kWorkspaceBytes),
      skinny_(stream),
      cublaslt_(stream, workspace_.data(), workspace_.bytes()) {
  PIPELINE_CUBLAS_CHECK(cublas().Create(&handle_));
  try {
    // Split-k parts summed in float32, never in a bf16 result's own type: the precision every
    // other path keeps (and cublaslt_matmul.cpp asks of cuBLASLt).
    PIPELINE_CUBLAS_CHECK(cublas().SetMathMode(
        handle_,
        cublasMath_t(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
    PIPELINE_CUBLAS_CHECK(cublas().SetStream(handle_, stream));
    PIPELINE_CUBLAS_CHECK(cublas().SetWorkspace(handle_, workspace_.data(), workspace_.bytes()));
  } catch (...) {
    cublas().Destroy(handle_);
    throw;
  }
}

Gemm::~Gemm() {
  cublas().Destroy(handle_);
}

void Gemm::linear(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* y, int rows,
                  int in, int out) {
  if (gemv_applies(rows, in)) return gemv(x, w, y, in, out, stream_);
  project(Product::bf16, route(Product::bf16, rows, in, out), x, w, y, nullptr, rows, in, out);
}

void Gemm::linear_f32(const __nv_bfloat16* x, const __nv_bfloat16* w, float* y, int rows, int in,
                      int out) {
  if (gemv_applies(rows, in)) return gemv(x, w, y, in, out, stream_);
  project(Product::f32, route(Product::f32, rows, in, out), x, w, y, nullptr, rows, in, out);
}

void Gemm::linear_silu_mul(const __nv_bfloat16* x, const __nv_bfloat16* w_gate_up,
                           __nv_bfloat16* gate_up, __nv_bfloat16* act, int rows, int in,
                           int inter) {
  if (gemv_applies(rows, in)) return gemv_silu_mul(x, w_gate_up, act, in, inter, stream_);
  project(Product::silu_mul, route(Product::silu_mul, rows, in, 2 * inter), x, w_gate_up, act,
          gate_up, rows, in, 2 * inter);
}

void Gemm::linear_cublas(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* y, int rows,
                         int in, int out) {
  gemm_ex(x, w, y, CUDA_R_16BF, rows, in, out);
}

// cuBLAS is column-major: a row-major [rows, n] matrix is a column-major [n, rows] one. So
// y^T [out, rows] = W [in, out]^T . x^T [in, rows], all leading dimensions the row lengths.
void Gemm::gemm_ex(const __nv_bfloat16* x, const __nv_bfloat16* w, void* y, cudaDataType_t y_type,
                   int rows, int in, int out) {
  const float alpha = 1.0f, beta = 0.0f;
  PIPELINE_CUBLAS_CHECK(cublas().GemmEx(handle_, CUBLAS_OP_T, CUBLAS_OP_N, out, rows, in, &alpha, w,
                                        CUDA_R_16BF, in, x, CUDA_R_16BF, in, &beta, y, y_type, out,
                                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void Gemm::project(Product product, const Route& route, const __nv_bfloat16* x,
                   const __nv_bfloat16* w, void* y, __nv_bfloat16* gate_up, int rows, int in,
                   int out) {
  auto* y16 = static_cast<__nv_bfloat16*>(y);
  const bool silu = product == Product::silu_mul;
  void* library_y = silu ? static_cast<void*>(gate_up) : y;
  const cudaDataType_t library_type = library_output_type(product);
  switch (route.path) {
    case Route::Path::skinny:
      if (product == Product::f32)
        return skinny_.run(x, w, static_cast<float*>(y), rows, in, out, route.skinny);
      if (silu) return skinny_.run_silu_mul(x, w, y16, rows, in, out / 2, route.skinny);
      return skinny_.run(x, w, y16, rows, in, out, route.skinny);
    case Route::Path::cublas:
      gemm_ex(x, w, library_y, library_type, rows, in, out);
      break;
    case Route::Path::cublaslt:
      if (!CublasLtMatmul::aligned(x, w, library_y) ||
          !cublaslt_.run(route.algo, x, w, library_y, library_type, rows, in, out)) {
        if (!route.fallback) throw std::runtime_error("cuBLASLt turned the call down");
        return project(product, fallback_of(route), x, w, y, gate_up, rows, in, out);
      }
      break;
  }
  if (silu) silu_mul(gate_up, rows, out / 2, y16, stream_);
}

Gemm::Route Gemm::route(Product product, int rows, int in, int out) {
  if (!skinny_gemm_applies(rows, in)) return Route{Route::Path::cublas};
  const std::tuple key{product, in, out, rows};
  if (const auto known = routes_.find(key); known != routes_.end()) return known->second;
  Route chosen{Route::Path::skinny, skinny_.plans(in, out).front()};  // untuned
  if (const auto tuned = tuned_.find({product, in, out, skinny_build_rows(rows)});
      tuned != tuned_.end()) {
    chosen = tuned->second;
    if (chosen.path == Route::Path::cublaslt &&
        !cublaslt_.runs(chosen.algo, library_output_type(product), rows, in, out))
      chosen = fallback_of(chosen);
  }
  return routes_[key] = chosen;
}

std::string Gemm::route_name(Product product, int rows, int in, int out) {
  if (gemv_applies(rows, in)) return "GEMV";
  const Route r = route(product, rows, in, out);
  switch (r.path) {
    case Route::Path::skinny:
      return std::string("SkinnyGemm ") + skinny_gemm_kernel_name(r.skinny.kernel) + ", k split " +
             std::to_string(r.skinny.splits) + " ways";
    case Route::Path::cublas:
      return "cuBLAS";
    case Route::Path::cublaslt:
      return "cuBLASLt";
  }
  return "";
}

std::string Gemm::tune(Product product, const __nv_bfloat16* x,
                       const std::vector<const __nv_bfloat16*>& weights, void* y,
                       __nv_bfloat16* gate_up, int in, int out, int max_rows) {
  auto matrix = [&](int i) { return weights[size_t(i) % weights.size()]; };
  // cuBLASLt's proposals assume aligned operands: a call that is not is turned down (project()),
  // and a proposal being timed has no fallback to take, so none would be timed.
  const void* library_y = product == Product::silu_mul ? gate_up : y;
  const bool lt_aligned = std::all_of(weights.begin(), weights.end(), [&](const __nv_bfloat16* w) {
    return CublasLtMatmul::aligned(x, w, library_y);
  });
  std::string report;
  for (int rows : kSkinnyBuildRows) {
    if (rows > max_rows || !skinny_gemm_applies(rows, in)) break;
    const TimeRoute time_route = [&](const Route& route) {
      return milliseconds_per_call(stream_, [&](int i) {
        project(product, route, x, matrix(i), y, gate_up, rows, in, out);
      });
    };
    report += (report.empty() ? "" : "; ") + std::to_string(rows) + " rows: ";
    std::vector<std::pair<Route, float>> skinny_kernels;
    float cublas_ms = 0.0f;
    try {
      skinny_kernels = fastest_skinny(in, out, time_route);
      cublas_ms = time_route(Route{Route::Path::cublas});
    } catch (const std::runtime_error& e) {
      // A timing that cannot run (its graph capture failed, say) leaves this row count untuned,
      // on SkinnyGemm, as a decode step whose capture fails runs eagerly: the runner still
      // serves. A sticky device error fails the next pass instead; any other is cleared here,
      // so that the next launch's check does not report it as its own.
      (void)cudaGetLastError();
      report += std::string("not timed (") + e.what() + ") -> SkinnyGemm";
      continue;
    }
    const auto [skinny, skinny_ms] =
        *std::min_element(skinny_kernels.begin(), skinny_kernels.end(),
                          [](const auto& a, const auto& b) { return a.second < b.second; });
    Route best = cublas_ms < skinny_ms ? Route{Route::Path::cublas} : skinny;
    const float best_ms = std::min(skinny_ms, cublas_ms);
    std::string lt_clause = "not timed (operands not aligned)";
    if (lt_aligned) {
      const ProposalTimes lt =
          time_proposals(library_output_type(product), rows, in, out, time_route);
      lt_clause = lt.summary();
      if (lt.timed > 0 && lt.fastest_ms < best_ms) {
        Route fastest = lt.fastest;
        fastest.fallback = best.path;
        fastest.skinny = skinny.skinny;
        best = fastest;
      }
    }
    tuned_[{product, in, out, rows}] = best;
    report += "SkinnyGemm";
    for (const auto& [route, ms] : skinny_kernels) {
      char time[96];
      std::snprintf(time, sizeof time, " %s %.1f us (k split %d ways),",
                    skinny_gemm_kernel_name(route.skinny.kernel), 1e3f * ms, route.skinny.splits);
      report += time;
    }
    char times[64];
    std::snprintf(times, sizeof times, " cuBLAS %.1f us, cuBLASLt ", 1e3f * cublas_ms);
    report += times + lt_clause;
    if (best.path == Route::Path::skinny)
      report += std::string(" -> SkinnyGemm ") + skinny_gemm_kernel_name(best.skinny.kernel);
    else
      report += best.path == Route::Path::cublas ? " -> cuBLAS" : " -> cuBLASLt";
  }
  routes_.clear();  // routes from before this tuning may have changed
  return report;
}

std::vector<std::pair<Gemm::Route, float>> Gemm::fastest_skinny(int in, int out,
                                                                const TimeRoute& time_route) {
  std::vector<std::pair<Route, float>> fastest;
  for (SkinnyGemmKernel kernel : skinny_.kernels()) {
    std::pair<Route, float> best;
    for (int splits : skinny_.split_options(in, out)) {
      const Route option{Route::Path::skinny, SkinnyPlan{splits, kernel}};
      const float ms = time_route(option);
      if (best.first.skinny.splits == 0 || ms < best.second) best = {option, ms};
    }
    fastest.push_back(best);
  }
  return fastest;
}

Gemm::ProposalTimes Gemm::time_proposals(cudaDataType_t y_type, int rows, int in, int out,
                                         const TimeRoute& time_route) {
  ProposalTimes times;
  std::vector<cublasLtMatmulAlgo_t> proposals;
  try {
    proposals = cublaslt_.candidates(y_type, rows, in, out, kCublasLtCandidates);
  } catch (const std::runtime_error& e) {
    times.error = e.what();
    return times;
  }
  times.proposed = int(proposals.size());
  for (const cublasLtMatmulAlgo_t& algo : proposals) {
    // One that cuBLASLt says does not run here is passed over, as is one whose timing fails.
    // Without a fallback, a call it turns down fails the timing, which would otherwise time the
    // fallback under the proposal's name.
    if (!cublaslt_.runs(algo, y_type, rows, in, out)) continue;
    const Route proposal{Route::Path::cublaslt, {}, algo, std::nullopt};
    float ms = 0.0f;
    try {
      ms = time_route(proposal);
    } catch (const std::runtime_error&) {
      (void)cudaGetLastError();  // a failed call's error is not the next launch's
      continue;
    }
    if (times.timed++ == 0 || ms < times.fastest_ms) {
      times.fastest = proposal;
      times.fastest_ms = ms;
    }
  }
  return times;
}

std::string Gemm::ProposalTimes::summary() const {
  if (!error.empty()) return "not proposed (" + error + ")";
  if (proposed == 0) return "none proposed";
  if (timed == 0) return "none of " + std::to_string(proposed) + " proposed ran";
  char text[64];
  std::snprintf(text, sizeof text, "%.1f us (fastest of %d of %d proposed)", 1e3f * fastest_ms,
                timed, proposed);
  return text;
}

}  // namespace pipeline::cuda
