// Whether programmatic dependent launch may be used: asked once, of a kernel of this build.
#include "kernels/cuda/dependent_launch.cuh"

namespace pipeline::cuda {
namespace {

// Compiled with the same architectures as every other kernel, so the PTX architecture the device
// runs it from is the one theirs came from.
__global__ void architecture_probe() {}

}  // namespace

bool dependent_launch_supported() {
  static const bool supported = [] {
    cudaFuncAttributes attributes{};
    // ptxVersion is the virtual architecture the code was compiled for (90 for compute_90),
    // whether the device runs it as built or compiled it from PTX on loading.
    return cudaFuncGetAttributes(&attributes, architecture_probe) == cudaSuccess &&
           attributes.ptxVersion >= 90;
  }();
  return supported;
}

}  // namespace pipeline::cuda
