// Error checks for CUDA runtime and cuBLAS calls: a failed call throws std::runtime_error naming
// the call, the error and the source line, so a device problem never passes silently.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "kernels/cuda/cublas_library.h"

namespace pipeline::cuda {

[[noreturn]] inline void throw_cuda_error(cudaError_t error, const char* call, const char* file,
                                          int line) {
  // The runtime also keeps a failed call's error as its "last error", which the next launch
  // check (cudaGetLastError) would report as that launch's: it is reported here instead.
  (void)cudaGetLastError();
  throw std::runtime_error(std::string("CUDA error: ") + call + " failed with " +
                           cudaGetErrorName(error) + " (" + cudaGetErrorString(error) + ") at " +
                           file + ":" + std::to_string(line));
}

[[noreturn]] inline void throw_cublas_error(cublasStatus_t status, const char* call,
                                            const char* file, int line) {
  throw std::runtime_error(
      std::string("cuBLAS error: ") + call + " failed with " + cublas().GetStatusName(status) +
      " (" + cublas().GetStatusString(status) + ") at " + file + ":" + std::to_string(line));
}

}  // namespace pipeline::cuda

#define PIPELINE_CUDA_CHECK(call)                                                          \
  do {                                                                                     \
    const cudaError_t pipeline_cuda_error_ = (call);                                       \
    if (pipeline_cuda_error_ != cudaSuccess)                                               \
      ::pipeline::cuda::throw_cuda_error(pipeline_cuda_error_, #call, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: reports launch-configuration errors at the launch that caused them.
#define PIPELINE_CUDA_CHECK_LAUNCH() PIPELINE_CUDA_CHECK(cudaGetLastError())

#define PIPELINE_CUBLAS_CHECK(call)                                                             \
  do {                                                                                          \
    const cublasStatus_t pipeline_cublas_status_ = (call);                                      \
    if (pipeline_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                       \
      ::pipeline::cuda::throw_cublas_error(pipeline_cublas_status_, #call, __FILE__, __LINE__); \
  } while (0)
