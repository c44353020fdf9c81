// What the CUDA benchmarks are held to: the device's copy bandwidth, measured in the benchmark's
// own process, and random bf16 data to fill device buffers with (never zeros: they can run
// faster than real data and hide unwritten outputs).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/cuda/cuda_check.h"

namespace pipeline::bench {

// Device-to-device copy bandwidth in bytes/s over a 1 GiB buffer (bytes read + bytes written),
// the median of 5 timed copies after a warm-up.
inline double measure_device_bandwidth() {
  const size_t bytes = size_t(1) << 30;
  void *src = nullptr, *dst = nullptr;
  PIPELINE_CUDA_CHECK(cudaMalloc(&src, bytes));
  PIPELINE_CUDA_CHECK(cudaMalloc(&dst, bytes));
  PIPELINE_CUDA_CHECK(cudaMemset(src, 0x5a, bytes));
  cudaEvent_t start, stop;
  PIPELINE_CUDA_CHECK(cudaEventCreate(&start));
  PIPELINE_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<float> ms;
  for (int i = 0; i < 6; ++i) {
    PIPELINE_CUDA_CHECK(cudaEventRecord(start));
    PIPELINE_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
    PIPELINE_CUDA_CHECK(cudaEventRecord(stop));
    PIPELINE_CUDA_CHECK(cudaEventSynchronize(stop));
    float t = 0;
    PIPELINE_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
    if (i > 0) ms.push_back(t);  // the first is a warm-up
  }
  std::sort(ms.begin(), ms.end());
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFree(src);
  cudaFree(dst);
  return 2.0 * double(bytes) / (double(ms[ms.size() / 2]) * 1e-3);
}

// Fills `count` device bf16 values with uniform values in [-scale, scale) from a 64 MiB host
// pattern of xorshift draws, repeated (its period is far beyond any cache). Complete on return:
// from pageable memory cudaMemcpy may return before its DMA ends, and the benchmarks' stream
// does not wait for the legacy stream's copies.
inline void fill_random_bf16(__nv_bfloat16* device, size_t count, float scale, uint64_t seed) {
  const size_t pattern = std::min(count, size_t(32) << 20);
  std::vector<__nv_bfloat16> host(pattern);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& v : host) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v = __float2bfloat16(scale * (float(x >> 40) * 0x1.0p-23f - 1.0f));
  }
  for (size_t done = 0; done < count; done += pattern)
    PIPELINE_CUDA_CHECK(cudaMemcpy(device + done, host.data(),
                                   std::min(pattern, count - done) * sizeof(__nv_bfloat16),
                                   cudaMemcpyHostToDevice));
  PIPELINE_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace pipeline::bench
