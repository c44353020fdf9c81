// Copies from global to shared memory that proceed while the thread goes on (cp.async, compute
// capability 8.0 and newer): a kernel keeps bytes in flight in shared memory instead of in
// registers. A thread issues copies, commits them as a group, and waits until at most N of its
// groups are still in flight; what its completed groups copied it may then read. Other threads
// may read it only after a barrier as well. Built for an older device, each copy completes at
// once and the waits do nothing.
#pragma once

#include <cuda_runtime.h>

namespace pipeline::cuda {

// 16 bytes from `global` to `shared` (both 16-byte aligned); zeros instead where !valid, and
// then `global` is not read.
__device__ __forceinline__ void copy_16_async(void* shared, const void* global, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(address), "l"(global),
               "r"(valid ? 16 : 0)
               : "memory");
#else
  *static_cast<uint4*>(shared) =
      valid ? *static_cast<const uint4*>(global) : make_uint4(0, 0, 0, 0);
#endif
}

// Closes the group of the copies issued since the last commit (an empty group is a group).
__device__ __forceinline__ void commit_async_copies() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// Returns once at most kInFlight of this thread's committed groups are still copying.
template <int kInFlight>
__device__ __forceinline__ void wait_async_copies() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kInFlight) : "memory");
#endif
}

}  // namespace pipeline::cuda
