// Whether programmatic dependent launch may be used: asked once, of a kernel of this build.
#include <cstdlib>
#include <string_view>

#include "kernels/cuda/dependent_launch.cuh"

namespace pipeline::cuda {
namespace {

// Compiled with the same architectures as every other kernel, so the PTX architecture the device
// runs it from is the one theirs came from.
__global__ void architecture_probe() {}

}  // namespace

int kernel_ptx_architecture() {
  static const int architecture = [] {
    cudaFuncAttributes attributes{};
    // ptxVersion is the virtual architecture the code was compiled for (90 for compute_90),
    // whether the device runs it as built or compiled it from PTX on loading.
    if (cudaFuncGetAttributes(&attributes, architecture_probe) != cudaSuccess) {
      (void)cudaGetLastError();  // not left for the next launch's check to report as its own
      return 0;
    }
    return attributes.ptxVersion;
  }();
  return architecture;
}

bool dependent_launch_supported() {
  // PIPELINE_CUDA_PDL=0 turns it off, so a result that differs with it on can be told apart
  // from a kernel's own error in one run (scripts/gpu_check.sh reruns failed tests so).
  static const bool supported = [] {
    const char* setting = std::getenv("PIPELINE_CUDA_PDL");
    const bool turned_off = setting && std::string_view(setting) == "0";
    return !turned_off && kernel_ptx_architecture() >= 90;
  }();
  return supported;
}

}  // namespace pipeline::cuda
