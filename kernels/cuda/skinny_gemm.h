// y [rows, out] = x [rows, in] . w [out, in]^T for 2 to kSkinnyMaxRows rows (a decode step of
// up to that many sequences) on tensor cores, with bf16 operands and float32 accumulation. Gemm
// uses it in place of cuBLAS where it applies.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cuda/device_buffer.h"

namespace pipeline::cuda {

// The kernel is built for up to 8, 16, 32 and 64 rows (one to eight n-tiles of 8 rows); a call
// runs the smallest build that holds its rows.
constexpr int kSkinnyBuildRows[] = {8, 16, 32, 64};
constexpr int kSkinnyMaxRows = 64;

// True when SkinnyGemm handles this product: 2..kSkinnyMaxRows rows, `in` a multiple of 8.
bool skinny_gemm_applies(int rows, int in);

// The build a call of `rows` rows (2..kSkinnyMaxRows) runs: the smallest kSkinnyBuildRows entry
// that holds them.
int skinny_build_rows(int rows);

// The ways a call of `in` by `out` may split k on a device of `resident_blocks` SkinnyGemm
// blocks at once, which Gemm::tune() times: first the most that still make one wave (or 1
// where the column tiles alone make more), then twice and four times as many where k is long
// enough and the partials fit. More, shorter splits balance the multiprocessors' load where
// the column tiles do not divide evenly among them, for the cost of float32 partials and a
// reduction.
std::vector<int> skinny_split_options(int in, int out, int resident_blocks);

// How a block's weights reach its warps. direct: each lane loads a pass of 16-byte chunks (four,
// two at 64 rows) into registers, then multiplies them. pipelined: each lane copies its chunks
// (cp.async) into a ring in shared memory, four stages of two chunks ahead of the one it
// multiplies, so the weight stream goes on while it computes, for 80 KiB of shared memory a
// block. Both compute the same
// sums in the same order, so their results are the same.
enum class SkinnyGemmKernel { direct, pipelined };
constexpr SkinnyGemmKernel kSkinnyGemmKernels[] = {SkinnyGemmKernel::direct,
                                                   SkinnyGemmKernel::pipelined};
const char* skinny_gemm_kernel_name(SkinnyGemmKernel kernel);
// The kernel of that name; std::invalid_argument naming the choices for any other.
SkinnyGemmKernel skinny_gemm_kernel_named(const std::string& name);

// The environment variable that leaves SkinnyGemm one kernel ("direct" or "pipelined") instead
// of both: to run tests, sanitizers or a benchmark on one of them, as
// PIPELINE_CUDA_DECODE_ATTENTION does for the decode attention.
constexpr const char* kSkinnyGemmVariable = "PIPELINE_CUDA_SKINNY_GEMM";

// How a call runs: its split of k (one of split_options()) and its kernel.
struct SkinnyPlan {
  int splits = 0;
  SkinnyGemmKernel kernel = SkinnyGemmKernel::direct;
};

// The kernel's launcher, with the scratch of its split-k reduction sized for the device. Its
// calls go to one stream, in order, as the scratch is reused from call to call.
class SkinnyGemm {
 public:
  explicit SkinnyGemm(cudaStream_t stream);

  // skinny_split_options() on this device.
  std::vector<int> split_options(int in, int out) const;
  // The kernels that run on this device: the direct one, and the pipelined one where two blocks
  // of a multiprocessor may have their rings (compute capability 8.0 and 9.0); or the one
  // kSkinnyGemmVariable names. The constructor throws std::invalid_argument where that names
  // none, or one that does not run here.
  const std::vector<SkinnyGemmKernel>& kernels() const { return kernels_; }
  // Every plan of a call of `in` by `out` on this device, which Gemm::tune() times: each kernel
  // that runs here at each of split_options(), the direct kernel's first split first.
  std::vector<SkinnyPlan> plans(int in, int out) const;

  // plan: one of plans(in, out).
  void run(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* y, int rows, int in,
           int out, const SkinnyPlan& plan);
  void run(const __nv_bfloat16* x, const __nv_bfloat16* w, float* y, int rows, int in, int out,
           const SkinnyPlan& plan);
  // act [rows, inter] = silu(gate) * up, where w_gate_up [2 * inter, in] holds gate row j at 2j
  // and up row j at 2j + 1.
  void run_silu_mul(const __nv_bfloat16* x, const __nv_bfloat16* w_gate_up, __nv_bfloat16* act,
                    int rows, int in, int inter, const SkinnyPlan& plan);

 private:
  // Leaves kernels_ the one kSkinnyGemmVariable names, if it names one.
  void keep_the_kernel_set();
  template <typename Out, bool kSiluMul = false>
  void launch(const __nv_bfloat16* x, const __nv_bfloat16* w, Out* y, int rows, int in, int out,
              const SkinnyPlan& plan);

  cudaStream_t stream_;
  int target_blocks_ = 0;  // resident blocks that fill the device
  std::vector<SkinnyGemmKernel> kernels_{SkinnyGemmKernel::direct};  // kernels()
  DeviceBuffer<float> partials_;    // [split][rows][out] of a split-k call
  DeviceBuffer<int32_t> arrivals_;  // per column tile: splits finished; zero between calls
};

}  // namespace pipeline::cuda
