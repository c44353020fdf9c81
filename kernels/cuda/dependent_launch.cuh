// Programmatic dependent launch (Hopper and newer): a kernel launched with launch_dependent()
// may be scheduled while the kernel before it in the stream is still finishing, which hides
// the launch latency between the many small dependent kernels of a decode step. Such a kernel
// calls wait_for_previous_kernel() before it touches memory that kernels write (it returns once
// the previous kernel has completed and its writes are visible) and then allow_next_kernel() so
// that its own successor may be scheduled early in turn. Reads of what no kernel of the pass
// writes (the weights, the pass's uploaded inputs, the keys and values earlier passes cached)
// may come before the wait, and then overlap the previous kernel's last blocks: every kernel
// waits before it lets its successor start, so all work before the previous kernel is done.
// Captured into a CUDA graph, the pair becomes a programmatic edge. On older devices both calls
// compile to nothing and the launch is an ordinary one.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dependent_launch.h"

namespace pipeline::cuda {

__device__ __forceinline__ void wait_for_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaGridDependencySynchronize();
#endif
}

__device__ __forceinline__ void allow_next_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaTriggerProgrammaticLaunchCompletion();
#endif
}

template <typename... Params, typename... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                      cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = dependent_launch_supported() ? 1 : 0;
  PIPELINE_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

}  // namespace pipeline::cuda
