// The projections of the forward pass: y = x . W^T with x [rows, in] and W in Hugging Face's
// [out, in] layout, bf16 operands, float32 accumulation. A single row goes to gemv(); 2 to 64
// rows to SkinnyGemm, or to whichever cuBLAS algorithm tune() found faster for that shape and
// number of rows; the rest to cuBLAS's own choice. One cuBLAS handle per stream, with its own
// workspace so that the calls can be captured into CUDA graphs; the cuBLASLt calls share that
// workspace, which is safe as both libraries only queue work on the one stream.
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/cuda/cublaslt_matmul.h"
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
  // up interleaved (gate row j of the weights at 2j, up row j at 2j + 1). The GEMV's and
  // SkinnyGemm's epilogues apply it; a cuBLAS projection's rows land in gate_up [rows, 2 * inter]
  // first.
  void linear_silu_mul(const __nv_bfloat16* x, const __nv_bfloat16* w_gate_up,
                       __nv_bfloat16* gate_up, __nv_bfloat16* act, int rows, int in, int inter);
  // y = x . w^T by cublasGemmEx at any row count: what linear() does past kSkinnyMaxRows rows,
  // and what the benchmarks hold the other paths against.
  void linear_cublas(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* y, int rows,
                     int in, int out);

  // What a call computes: linear(), linear_f32() or linear_silu_mul().
  enum class Product { bf16, f32, silu_mul };

  // The route a call of `rows` rows takes, in words ("GEMV", "SkinnyGemm direct, k split 2
  // ways", "cuBLAS", "cuBLASLt"); out is the weight rows, as for tune().
  std::string route_name(Product product, int rows, int in, int out);

  // How many of cuBLASLt's proposals tune() times, in its heuristic's order, per product, shape
  // and row count.
  static constexpr int kCublasLtCandidates = 8;

  // Times SkinnyGemm at each of its plans(), cuBLAS's own choice and up to
  // kCublasLtCandidates algorithms cuBLASLt proposes (with the SiLU*mul kernel after the library's,
  // for silu_mul) on [out, in] matrices at each SkinnyGemm build's row count up to max_rows, and
  // from then on sends the calls of that product, shape and build to the fastest. Successive calls
  // take successive matrices of `weights` (every layer's, say), so that they come from memory, not
  // from L2, as in a forward pass. x holds max_rows rows of `in`; y (act, for silu_mul) and gate_up
  // take the results. Not while the stream is being captured. Returns what it measured.
  std::string tune(Product product, const __nv_bfloat16* x,
                   const std::vector<const __nv_bfloat16*>& weights, void* y,
                   __nv_bfloat16* gate_up, int in, int out, int max_rows);

 private:
  // The path a call takes: SkinnyGemm, cublasGemmEx (cuBLAS's own choice of algorithm), or
  // cuBLASLt with an algorithm tune() chose.
  struct Route {
    enum class Path { skinny, cublas, cublaslt } path = Path::skinny;
    // SkinnyGemm's kernel and split of k (one of its plans()), for skinny and a cublaslt
    // fallback.
    SkinnyPlan skinny{};
    cublasLtMatmulAlgo_t algo{};  // for cublaslt
    // For cublaslt: the route of the calls its algorithm does not run (at some row count or on
    // unaligned operands), the faster of the other two; none for a proposal being timed, whose
    // refused call throws instead.
    std::optional<Path> fallback = Path::cublas;
  };
  static Route fallback_of(const Route& route) { return Route{*route.fallback, route.skinny}; }

  // y = x . w^T by cublasGemmEx and the algorithm cuBLAS chooses.
  void gemm_ex(const __nv_bfloat16* x, const __nv_bfloat16* w, void* y, cudaDataType_t y_type,
               int rows, int in, int out);
  // One product by one route (for silu_mul through a library, the gate/up columns into gate_up,
  // then the SiLU*mul kernel). y is bf16, float32 for f32, act for silu_mul; out is the weight
  // rows (2 * inter for silu_mul). A cublaslt route whose algorithm refuses the call (it is
  // not aligned as cuBLASLt assumes, or cuBLASLt turns it down) takes its fallback, or throws
  // std::runtime_error where it has none.
  void project(Product product, const Route& route, const __nv_bfloat16* x, const __nv_bfloat16* w,
               void* y, __nv_bfloat16* gate_up, int rows, int in, int out);
  // The route of a call: the tuned one of its build, or its fallback where cuBLASLt says the
  // tuned algorithm does not run these rows; SkinnyGemm where untuned; cublasGemmEx past
  // SkinnyGemm's rows.
  Route route(Product product, int rows, int in, int out);
  // Milliseconds a call by a route takes, for tune(): milliseconds_per_call() of that product on
  // successive matrices.
  using TimeRoute = std::function<float(const Route&)>;
  // What time_proposals() found: the fastest of cuBLASLt's proposals and its time, how many
  // were proposed and how many ran; or why none were.
  struct ProposalTimes {
    Route fastest;
    float fastest_ms = 0.0f;
    int proposed = 0, timed = 0;
    std::string error;
    std::string summary() const;  // for tune()'s report
  };
  ProposalTimes time_proposals(cudaDataType_t y_type, int rows, int in, int out,
                               const TimeRoute& time_route);
  // SkinnyGemm's fastest plan for this shape by each of its kernels: their routes and times,
  // the direct kernel's first.
  std::vector<std::pair<Route, float>> fastest_skinny(int in, int out, const TimeRoute& time_route);

  cudaStream_t stream_;
  cublasHandle_t handle_ = nullptr;
  DeviceBuffer<std::byte> workspace_;
  SkinnyGemm skinny_;
  CublasLtMatmul cublaslt_;
  // (product, in, out, SkinnyGemm build) -> the fastest route; absent: not tuned, SkinnyGemm.
  std::map<std::tuple<Product, int, int, int>, Route> tuned_;
  // (product, in, out, rows) -> route(), which checks a tuned cuBLASLt algorithm at the call's
  // own row count once.
  std::map<std::tuple<Product, int, int, int>, Route> routes_;
};

}  // namespace pipeline::cuda
