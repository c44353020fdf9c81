// Owned CUDA objects (a stream, an event, an instantiated graph), the capture of a stream's
// work into a graph and the timing of captured calls, and the current device's multiprocessor
// count, which grids are sized by.
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <memory>

#include "kernels/cuda/cuda_check.h"

namespace pipeline::cuda {

inline int multiprocessor_count() {
  int device = 0, count = 0;
  PIPELINE_CUDA_CHECK(cudaGetDevice(&device));
  PIPELINE_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  return count;
}

class Stream {
 public:
  Stream() { PIPELINE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(stream_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

class Event {
 public:
  Event() { PIPELINE_CUDA_CHECK(cudaEventCreate(&event_)); }
  ~Event() { cudaEventDestroy(event_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

class GraphExec {
 public:
  explicit GraphExec(cudaGraphExec_t exec) : exec_(exec) {}
  ~GraphExec() { cudaGraphExecDestroy(exec_); }
  GraphExec(const GraphExec&) = delete;
  GraphExec& operator=(const GraphExec&) = delete;
  void launch(cudaStream_t stream) const { PIPELINE_CUDA_CHECK(cudaGraphLaunch(exec_, stream)); }

 private:
  cudaGraphExec_t exec_;
};

// What `enqueue` puts on `stream`, captured (none of it runs) and instantiated as a graph. The
// capture is ended even when `enqueue` throws.
inline std::unique_ptr<GraphExec> capture_graph(cudaStream_t stream,
                                                const std::function<void()>& enqueue) {
  cudaGraph_t graph = nullptr;
  PIPELINE_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  try {
    enqueue();
  } catch (...) {
    // Ending a capture the failure invalidated fails too, and the runtime keeps that as its
    // last error, which the next launch's check would report as its own: it is cleared here,
    // where the error that ended the capture is already on its way.
    cudaStreamEndCapture(stream, &graph);
    (void)cudaGetLastError();
    if (graph) cudaGraphDestroy(graph);
    throw;
  }
  PIPELINE_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  PIPELINE_CUDA_CHECK(instantiated);
  return std::make_unique<GraphExec>(exec);
}

// Milliseconds one call takes on the device, as a decode step makes it: eight calls captured
// as a graph (timing eager launches would time the host's launch rate for the shorter kernels),
// the best of three replays after an untimed one; call(i) enqueues the i-th call on `stream`.
// It runs once eagerly first, so that kernels load and libraries choose their algorithms
// outside the capture. Not while the stream is being captured.
inline float milliseconds_per_call(cudaStream_t stream, const std::function<void(int)>& call) {
  constexpr int kCalls = 8;
  auto make_calls = [&] {
    for (int i = 0; i < kCalls; ++i) call(i);
  };
  make_calls();
  const auto calls = capture_graph(stream, make_calls);
  const Event start, stop;
  calls->launch(stream);  // untimed
  float best = 0.0f;
  for (int run = 0; run < 3; ++run) {
    PIPELINE_CUDA_CHECK(cudaEventRecord(start.get(), stream));
    calls->launch(stream);
    PIPELINE_CUDA_CHECK(cudaEventRecord(stop.get(), stream));
    PIPELINE_CUDA_CHECK(cudaEventSynchronize(stop.get()));
    float ms = 0.0f;
    PIPELINE_CUDA_CHECK(cudaEventElapsedTime(&ms, start.get(), stop.get()));
    if (run == 0 || ms < best) best = ms;
  }
  return best / kCalls;
}

}  // namespace pipeline::cuda
