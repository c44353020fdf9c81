// Host <-> device copies for the CUDA tests, each complete on return.
#pragma once

#include <cuda_runtime.h>

#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_buffer.h"

namespace pipeline::cuda {

// Copies `host` over `device` (of the same size). The copy is complete on return: from
// pageable memory cudaMemcpy may return before its DMA ends, and the kernels run on a stream
// that does not wait for the legacy stream's copies.
template <typename T>
void restore(const std::vector<T>& host, DeviceBuffer<T>& device) {
  PIPELINE_CUDA_CHECK(
      cudaMemcpy(device.data(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  PIPELINE_CUDA_CHECK(cudaDeviceSynchronize());
}

// `host` in a new device buffer, complete on return as restore()'s copy is.
template <typename T>
DeviceBuffer<T> upload(const std::vector<T>& host) {
  DeviceBuffer<T> device(host.size());
  restore(host, device);
  return device;
}

// Waits for the device, then copies `device` back.
template <typename T>
std::vector<T> download(const DeviceBuffer<T>& device) {
  PIPELINE_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<T> host(device.size());
  PIPELINE_CUDA_CHECK(
      cudaMemcpy(host.data(), device.data(), device.bytes(), cudaMemcpyDeviceToHost));
  return host;
}

}  // namespace pipeline::cuda
