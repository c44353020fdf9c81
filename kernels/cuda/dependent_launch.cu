// Whether programmatic dependent launch may be used: asked once, of a kernel of this build.
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
  return kernel_ptx_architecture() >= 90;
}

}  // namespace pipeline::cuda
